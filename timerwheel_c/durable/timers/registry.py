"""Timer handlers and the registry that maps a :class:`TimerKind` to its handler.

A durable timer row carries a kind (1..255) in its key; the runner looks the kind up in a
:class:`TimerRegistry` and calls that handler's :meth:`TimerHandler.fire`. The handler
answers with an outcome:

- :class:`Done` ``(batch)``: the timer is finished; the runner applies ``batch`` together
  with the removal of the row, guarded on the row, so the batch's effects are applied at
  most once per timer row.
- :class:`Reschedule` ``(due_at_ms, value, batch)``: as Done, but the row moves to a new
  due time (Unix epoch ms) with a new value.
- :class:`Retry` ``()``: try again later, with the handler's backoff, or ``Retry(delay=s)`` in ``s`` seconds.

Raising an exception, returning anything that is not an outcome (a forgotten ``return Done()``)
and :class:`Retry` are failed attempts: each counts toward the handler's
:attr:`TimerHandler.max_attempts`, after which the timer is *parked* (kept with its last error,
never retried until requeued). Effects *outside* the batch must be idempotent,
because ``fire`` may run more than once (the process can die before the commit).

A handler is a :class:`TimerHandler` subclass, or a plain function ``fire(ctx, timer)`` (sync or
``async def``) registered with the :meth:`TimerRegistry.handler` decorator, as procrastinate's
``@app.task`` registers a task:

    registry = TimerRegistry()

    @registry.handler(TimerKind(1), max_attempts=5)
    def expire_ticket(ctx, timer):
        return Done()
"""
from __future__ import annotations

import dataclasses
import datetime
import inspect
import math
import threading
from dataclasses import dataclass
from typing import Any, Optional, Union

from .codecs import decoded
from .due import due_at_ms_of
from .keys import MAX_ATTEMPT, TimerKind, check_value
from .tick import Backoff
from ..storage.redact import redact
from ..storage.store import Batch, Store

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "Backoff",
    "Done",
    "DueTimer",
    "Reschedule",
    "Retry",
    "FunctionHandler",
    "TimerContext",
    "TimerHandler",
    "TimerKind",
    "TimerRegistry",
    "check_max_attempts",
    "check_registry",
    "is_async",
]

# Oban's default is 20 and River's and Sidekiq's 25; see TimerHandler for why 20 here.
DEFAULT_MAX_ATTEMPTS = 20


@dataclass(frozen=True)
class DueTimer:
    """The timer handed to :meth:`TimerHandler.fire`.

    ``due_at_ms``: the time it was scheduled for (Unix epoch ms), kept across backoffs.
    ``kind``: the :class:`TimerKind`. ``reference``: bytes as scheduled. ``value``: bytes as
    scheduled; for a handler of a kind with a codec, the value it decodes (a dict for ``codec="json"``).
    ``attempt``: 1 on the first try, growing by one per try (the runner claims the row
    with its next attempt before calling ``fire``). ``key``: the row's key as claimed.
    """

    due_at_ms: int
    kind: TimerKind
    reference: bytes
    value: Any  # bytes, or a codec's decoded value: a handler indexes it without a cast
    attempt: int
    key: bytes


_new, _set = object.__new__, object.__setattr__


def due_timer(due_at_ms: int, kind: TimerKind, reference: bytes, value: Any, attempt: int, key: bytes) -> DueTimer:
    """A :class:`DueTimer` of fields a claim has already checked (a parsed key's, the kind from
    :data:`~.keys.KINDS`), made without a call of the frozen dataclass's ``__init__``: a runner makes
    one per row it fires."""
    return set_timer_fields(_new(DueTimer), due_at_ms, kind, reference, value, attempt, key)


def set_timer_fields(record: Any, due_at_ms: int, kind: TimerKind, reference: bytes, value: Any, attempt: int,
                     key: bytes) -> Any:
    """Set :class:`DueTimer`'s fields on ``record`` (a DueTimer, or a record that holds a timer's fields
    itself), as a frozen dataclass's ``__init__`` sets them (not through the instance's ``__dict__``,
    which would give each record a dict of its own for the collector to track); returns ``record``."""
    _set(record, "due_at_ms", due_at_ms)
    _set(record, "kind", kind)
    _set(record, "reference", reference)
    _set(record, "value", value)
    _set(record, "attempt", attempt)
    _set(record, "key", key)
    return record


@dataclass(frozen=True)
class TimerContext:
    """What ``fire`` may use: the ``store``, the ``partition`` and the tick's ``now_ms`` (Unix epoch ms)."""

    store: Store
    partition: str
    now_ms: int


@dataclass(frozen=True)
class Done:
    """Outcome: the timer is finished; ``batch`` (or nothing) commits with the row's removal."""

    batch: Optional[Batch] = None


@dataclass(frozen=True)
class Reschedule:
    """Outcome: move the timer to ``due_at_ms`` (Unix epoch ms, a timezone-aware datetime or a
    ``datetime.timedelta`` from now, converted on construction) with ``value``; ``batch`` commits
    with the move.

    ``value``: bytes; for a kind with a codec, a value as its handler receives one (a dict for
    ``codec="json"``), which the runner encodes with that codec when it settles the outcome, as a
    writer does (so a handler called directly, in a test, returns the value itself).

    A Reschedule whose key equals the row's scheduled key, whose due time is not a valid one, or
    whose value its kind cannot store (not bytes without a codec, or one the codec refuses), is a
    failure (the row backs off). A naive datetime raises ValueError, and bytes longer than
    :data:`~.keys.MAX_TIMER_VALUE_BYTES` raise ValueError.
    """

    due_at_ms: int
    value: object
    batch: Optional[Batch] = None

    def __post_init__(self):
        if isinstance(self.value, (bytes, bytearray, memoryview)):
            check_value("Reschedule.value", self.value)
        if isinstance(self.due_at_ms, (int, datetime.datetime, datetime.timedelta)) and not isinstance(self.due_at_ms, bool):
            # Other types are left for the runner to reject (and count) when it settles the outcome.
            object.__setattr__(self, "due_at_ms", due_at_ms_of(self.due_at_ms, "Reschedule.due_at_ms"))


@dataclass(frozen=True)
class Retry:
    """Outcome: not now; the row stays backed off and is tried again later: after the handler's
    backoff, or ``delay`` seconds later when given (a number >= 0, rounded up to the ms, as Celery's
    ``retry(countdown=)``; one past the range of due times waits until the last of them), counted from
    when the call returned in a service, from the tick's ``now_ms`` in :func:`~.runner.run_due`. It is a
    failed attempt:
    it counts toward :attr:`TimerHandler.max_attempts` (as Celery's ``retry()`` counts toward its
    ``max_retries``), so a handler that polls with Retry sets ``max_attempts`` to cover its wait,
    or None.

    Raises:
        TypeError / ValueError: a delay that is not a finite number >= 0, naming it.
    """

    delay: Optional[float] = None

    def __post_init__(self):
        delay = self.delay
        if delay is None:
            return
        if isinstance(delay, bool) or not isinstance(delay, (int, float)):
            raise TypeError(f"Retry.delay must be a number of seconds or None, got {type(delay).__name__} {delay!r}")
        if not (math.isfinite(delay) and delay >= 0):
            raise ValueError(f"Retry.delay must be finite and >= 0 seconds, got {delay!r}")


def check_max_attempts(value: object) -> Optional[int]:
    """Return ``value`` if it is a valid :attr:`TimerHandler.max_attempts`: an int >= 1, or None.

    Raises:
        TypeError: not an int (a bool, a float, a str...), naming the value.
        ValueError: an int outside 1..2**32-1 (the most attempts a row counts), naming the value.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_attempts must be an int >= 1 or None (retry for ever), got {type(value).__name__} "
                        f"{value!r}")
    if not 1 <= value <= MAX_ATTEMPT:
        # Above MAX_ATTEMPT the key's attempt count saturates and would never reach it.
        raise ValueError(f"max_attempts must be in 1..{MAX_ATTEMPT} or None (retry for ever), got {value!r}")
    return value


class TimerHandler:
    """Base class for handlers: set ``kind`` (a :class:`TimerKind` or an int 1..255) and
    optionally ``max_per_tick`` (an int >= 1, lowering the tick budget's per-kind cap for
    this kind; None for no extra cap) and ``timeout_s`` (seconds, finite and > 0: a call of
    :meth:`fire` running longer is counted as failed and its row backs off; an ``async def``
    fire is cancelled, a sync one keeps its worker thread until it returns, and its late
    outcome is dropped; None, the default, for no limit), and implement :meth:`fire`.

    ``max_attempts``: how many attempts a timer of this kind gets (an int >= 1), or None to retry
    for ever. Every call of :meth:`fire` is an attempt, counted when the row is claimed, before the
    call: one that raises, returns :class:`Retry` or anything but an outcome, runs past
    ``timeout_s``, or never ends (its process died) is a failed attempt. After the last failed
    attempt the timer is *parked*: kept with its attempt count, its original due time and its
    last error (``PendingTimer.last_error``), never retried, until
    :func:`~timerwheel_c.durable.requeue` puts it back. A schedule's occurrence that parks
    pauses its schedule (``resume_schedule`` continues it).

    The default, 20 (:data:`DEFAULT_MAX_ATTEMPTS`), spans about 2 hours 10 minutes of retries at
    the backoff of ``min(5 s * 2**(a-1), 600 s)`` (5 s, 10 s ... 320 s, then every 10 minutes):
    long enough to ride out a deploy, a database failover or an hour-long outage of a service
    the handler calls, short enough that a broken handler stops repeating its side effects the
    same day. It sits with the job queues users come from (Oban 20, River and Sidekiq 25
    attempts) rather than Celery's 3 retries or procrastinate's single attempt, which here
    would park a timer on a blip of under a minute; Temporal's activities retry for ever by
    default, which is ``max_attempts = None``. ``max_attempts = 1`` fires a timer at most once
    (a process that dies during its only attempt parks it instead of firing it again).
    """

    kind: Union[TimerKind, int, None] = None
    max_per_tick: Optional[int] = None
    timeout_s: Optional[float] = None
    max_attempts: Optional[int] = DEFAULT_MAX_ATTEMPTS
    #: The delays between attempts (:class:`~.tick.Backoff`: base, factor, cap, jitter); None: the
    #: default, 5 s doubling up to 10 minutes.
    backoff: Optional[Backoff] = None
    # The runner refuses an outcome whose batch writes a reserved key (0x00 first), but from the
    # library's own handlers (durable sleep), whose rows live there.
    _writes_reserved_keys = False

    def fire(self, ctx: TimerContext, timer: DueTimer):
        """Handle one due timer; return :class:`Done`, :class:`Reschedule` or :class:`Retry`, or raise."""
        raise NotImplementedError


def is_async(fire: object) -> bool:
    """Whether a handler's ``fire`` makes a coroutine for the runner to await: an ``async def`` function
    or method, or an object whose ``__call__`` is one (an instance of a class with ``async def
    __call__``, which :func:`inspect.iscoroutinefunction` does not tell)."""
    return inspect.iscoroutinefunction(fire) or (callable(fire) and inspect.iscoroutinefunction(type(fire).__call__))


def _decoding(fire, codec):
    """``fire`` called with the timer's value decoded by ``codec`` (a decode error is that attempt's
    failure); an ``async def`` stays one, so that the service still awaits it on its loop."""
    if is_async(fire):
        async def decoded_async(ctx, timer):
            return await fire(ctx, dataclasses.replace(timer, value=decoded(codec, timer.value)))

        decoded_async.decodes = codec
        return decoded_async

    def decoded_sync(ctx, timer):
        return fire(ctx, dataclasses.replace(timer, value=decoded(codec, timer.value)))

    decoded_sync.decodes = codec
    return decoded_sync


def handler_name(handler: TimerHandler) -> str:
    """How logs and messages name ``handler``: a function handler by its function's qualified name,
    a class handler by its class."""
    return handler.name if isinstance(handler, FunctionHandler) else type(handler).__name__


class FunctionHandler(TimerHandler):
    """A plain function ``function(ctx, timer)``, sync or ``async def`` (or an object whose ``__call__`` is
    one), as the handler of ``kind``,
    with the options a :class:`TimerHandler` subclass sets as class attributes. Made by
    :meth:`TimerRegistry.handler`; ``function`` must return an outcome as :meth:`TimerHandler.fire`
    does (a forgotten ``return Done()`` is a failed attempt).

    ``function`` becomes this object's ``fire`` itself, not a method that calls it, so a fire costs
    what a class handler's does, and an ``async def`` one is awaited on the service's loop."""

    def __init__(self, function, kind, *, max_attempts: Optional[int] = DEFAULT_MAX_ATTEMPTS,
                 timeout_s: Optional[float] = None, max_per_tick: Optional[int] = None,
                 backoff: Optional[Backoff] = None):
        if not callable(function):
            raise TypeError(f"a handler function must be callable, got {type(function).__name__} {function!r}")
        self.fire = function  # type: ignore[method-assign]
        self.name: str = getattr(function, "__qualname__", None) or repr(function)
        self.kind = kind
        self.max_attempts = max_attempts
        self.timeout_s = timeout_s
        self.max_per_tick = max_per_tick
        self.backoff = backoff

    def __repr__(self):
        return f"FunctionHandler({self.name}, kind={self.kind!r})"


class TimerRegistry:
    """Handlers by kind. ``register`` chains: ``TimerRegistry().register(a).register(b)``.

    It also remembers which unknown kinds have been warned about, so the runner logs
    each unknown kind once per registry (that is, once per service).
    """

    def __init__(self):
        self._handlers: dict[int, TimerHandler] = {}
        self._warned: set[int] = set()
        self._lock = threading.Lock()

    def register(self, handler: TimerHandler) -> "TimerRegistry":
        """Add ``handler`` under ``handler.kind``; returns self.

        A kind with a codec (``TimerKind(n, name, codec=...)``) has its handler's ``fire`` receive the
        timer's value decoded.

        Raises:
            TypeError: not a TimerHandler instance, or a kind / max_per_tick / timeout_s / max_attempts
                of the wrong type.
            ValueError: kind 0 or outside 1..255, a kind already registered, max_per_tick < 1,
                timeout_s not finite and > 0, max_attempts outside 1..2**32-1.
        """
        if not isinstance(handler, TimerHandler):
            raise TypeError(f"expected a TimerHandler instance, got {type(handler).__name__} {handler!r}")
        if handler.kind is None:
            raise TypeError(f"{type(handler).__name__} has no kind attribute")
        kind = TimerKind(handler.kind).get()
        cap = handler.max_per_tick
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int)):
            raise TypeError(f"max_per_tick must be an int or None, got {type(cap).__name__} {cap!r}")
        if cap is not None and cap < 1:
            raise ValueError(f"max_per_tick must be >= 1 or None, got {cap}")
        timeout = handler.timeout_s
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
            raise TypeError(f"timeout_s must be a number of seconds or None, got {type(timeout).__name__} {timeout!r}")
        if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout_s must be finite and > 0 seconds, or None, got {timeout!r}")
        check_max_attempts(handler.max_attempts)
        if handler.backoff is not None and not isinstance(handler.backoff, Backoff):
            raise TypeError(f"backoff must be a Backoff or None, got {type(handler.backoff).__name__} "
                            f"{handler.backoff!r}")
        if kind in self._handlers:
            raise ValueError(f"kind {kind} is already registered to {self._handlers[kind]!r}")
        codec = getattr(handler.kind, "codec", None)
        if codec is not None and getattr(handler.fire, "decodes", None) is not codec:
            handler.fire = _decoding(handler.fire, codec)  # type: ignore[method-assign]
        self._handlers[kind] = handler
        return self

    def handler(self, kind, *, max_attempts: Optional[int] = DEFAULT_MAX_ATTEMPTS, timeout_s: Optional[float] = None,
                max_per_tick: Optional[int] = None, backoff: Optional[Backoff] = None):
        """Decorator: register the decorated function ``f(ctx, timer)`` (sync or ``async def``) as the
        handler of ``kind`` (a :class:`TimerKind` or an int 1..255), with the options of
        :class:`TimerHandler`; returns ``f`` itself, still callable (a test calls it directly).

        Raises:
            TypeError / ValueError: as :meth:`register` (a bad kind or option, a kind already
                registered), at decoration time; TypeError for a non-callable.
        """
        def register(function):
            self.register(FunctionHandler(function, kind, max_attempts=max_attempts, timeout_s=timeout_s,
                                          max_per_tick=max_per_tick, backoff=backoff))
            return function

        return register

    def get(self, kind: int) -> Optional[TimerHandler]:
        """The handler for ``kind`` (an int), or None."""
        return self._handlers.get(kind)

    def kinds(self) -> list:
        """The registered kinds, sorted ints."""
        return sorted(self._handlers)

    def named_kinds(self) -> list:
        """The registered kinds as their handlers give them (TimerKinds with their names, or ints)."""
        return [self._handlers[kind].kind for kind in sorted(self._handlers)]

    def first_unknown(self, kind: int) -> bool:
        """True the first time ``kind`` is reported unknown to this registry, False after."""
        with self._lock:
            if kind in self._warned:
                return False
            self._warned.add(kind)
            return True


def check_registry(registry: object) -> TimerRegistry:
    """Return ``registry`` if it is a :class:`TimerRegistry`.

    Raises:
        TypeError: naming what was passed instead, any password in it masked (a store URL passed
            where the registry goes is the usual mistake).
    """
    if not isinstance(registry, TimerRegistry):
        raise TypeError(f"registry must be a TimerRegistry, got {type(registry).__name__} {redact(repr(registry))}")
    return registry
