"""TimerKind and TimerRegistry: validation at startup, chaining, lookups."""
from __future__ import annotations

import pytest

from timerwheel_c.durable.timers.registry import Done, Reschedule, TimerHandler, TimerKind, TimerRegistry


class H(TimerHandler):
    kind = TimerKind(0xF0)

    def fire(self, ctx, timer):
        return Done()


def test_timer_kind_range_and_identity():
    """TimerKind takes 1..255, .get() returns n, equal kinds are equal and hash alike; 0, 256 and
    non-ints are rejected with the offending value named."""
    assert TimerKind(1).get() == 1 and TimerKind(255).get() == 255
    assert TimerKind(7) == TimerKind(7) and hash(TimerKind(7)) == hash(TimerKind(7)) and TimerKind(7) == 7
    for bad in (0, 256, -1):
        with pytest.raises(ValueError, match=str(bad)):
            TimerKind(bad)
    for bad in ("1", 1.0, True, None):
        with pytest.raises(TypeError):
            TimerKind(bad)


def test_register_chains_and_rejects_duplicates_and_kind_zero():
    """register returns the registry; a duplicate kind, kind 0, a non-handler or a bad max_per_tick
    raise at registration time."""

    class H2(H):
        kind = 0xF1

    reg = TimerRegistry()
    assert reg.register(H()).register(H2()) is reg
    assert reg.kinds() == [0xF0, 0xF1] and isinstance(reg.get(0xF0), H) and reg.get(3) is None
    with pytest.raises(ValueError, match="already registered"):
        reg.register(H())

    class Zero(H):
        kind = 0

    with pytest.raises(ValueError, match="0"):
        TimerRegistry().register(Zero())

    class NoKind(TimerHandler):
        pass

    with pytest.raises(TypeError, match="no kind"):
        TimerRegistry().register(NoKind())
    with pytest.raises(TypeError, match="TimerHandler instance"):
        TimerRegistry().register(H)

    class Capped(H):
        max_per_tick = 0

    with pytest.raises(ValueError, match="max_per_tick"):
        TimerRegistry().register(Capped())


def test_reschedule_value_is_checked_at_construction_when_bytes_and_kept_as_given_otherwise():
    """A Reschedule's bytes longer than a timer value holds are a ValueError at construction; any
    other value is kept as given, for a codec kind's runner to encode (a handler called directly
    returns it as it made it), and a kind without a codec refuses it when the outcome is settled
    (tests/durable/timers/test_durable_api.py)."""
    from timerwheel_c.durable.timers.keys import MAX_TIMER_VALUE_BYTES

    with pytest.raises(ValueError, match="Reschedule.value must be at most"):
        Reschedule(1, b"v" * (MAX_TIMER_VALUE_BYTES + 1))
    assert Reschedule(1, {"n": 1}).value == {"n": 1}
