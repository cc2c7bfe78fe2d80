"""The compiled cores and their pure twins share one source of truth and say the same things.

Each test compares the compiled module with its pure twin directly (not through the
``*_impl`` fixtures): the property is about the pair. The shared values live in
each core's neutral module (``timerwheel_c._common`` for the wheel,
``timerwheel_c._release_common`` for the release timer); a compiled core compiles its own copy
in, and these tests hold the copies equal.
"""
from __future__ import annotations

import ast
import asyncio
import importlib
import re
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import pytest

import timerwheel_c._aio_common as aio_common
import timerwheel_c._common as common
import timerwheel_c._release_common as release_common
from locations import CHECKOUT

pytestmark = pytest.mark.c_extension

WHEEL_CONSTANTS = ("L0_BITS", "L0_SLOTS", "LEVEL_BITS", "LEVEL_SLOTS", "NUM_LEVELS", "LEVEL_BASE",
                   "NUM_SLOTS", "NUM_WORDS", "MAX_ENTRIES")
RELEASE_CONSTANTS = ("SLICE_NS", "SWEEP_MIN_HEAP", "SWEEP_EVERY_NS", "WAIT_CHUNK_NS")
# Each core's neutral module of shared helpers and constants.
SHARED = {"wheel": common, "release": release_common}


def _pair(core: str):
    return importlib.import_module(f"timerwheel_c._{core}"), importlib.import_module(f"timerwheel_c.pure.{core}")


@pytest.mark.parametrize("core, names", [("wheel", WHEEL_CONSTANTS), ("release", RELEASE_CONSTANTS)])
def test_public_constants_are_equal_in_both_twins_and_the_shared_module(core, names):
    """Every constant a compiled core compiles in equals the pure twin's and the shared module's."""
    c, pure = _pair(core)
    for name in names:
        assert getattr(c, name) == getattr(pure, name) == getattr(SHARED[core], name), name


def test_wheel_geometry_names_match_the_flat_slot_layout():
    """The named geometry describes the layout the design comment states: 512 + 9 * 64 slots,
    level l >= 1 in word 7 + l, slot widths 2**(6l + 3) ms, the top level covering 2**63 ms."""
    assert common.L0_SLOTS == 512 and common.LEVEL_SLOTS == 64 and common.LEVEL_BASE == 448
    assert common.NUM_SLOTS == 1088 and common.NUM_WORDS == 17
    assert [common.level_shift(level) for level in range(1, common.NUM_LEVELS)] == [6 * lv + 3 for lv in range(1, 10)]
    assert common.level_shift(common.NUM_LEVELS - 1) + common.LEVEL_BITS == 63
    assert (common.LEVEL_BASE + common.LEVEL_SLOTS * 1) // 64 == 8  # level 1 is word 8


def test_entry_limit_is_the_same_in_both_twins():
    """Both pools stop at MAX_ENTRIES = 2**31 - 1 entries (int32 indexes), and both say so with
    the same MemoryError. The C check is on its pool's capacity, the pure one on its length; the
    pure twin is driven to its limit by giving it a pool that already holds MAX_ENTRIES - 1."""
    _, pure = _pair("wheel")
    assert common.MAX_ENTRIES == 2**31 - 1
    w = pure.TimerWheel(now_ms=0)

    class Huge(list):
        def __len__(self):
            return common.MAX_ENTRIES

    w._due = Huge()
    with pytest.raises(MemoryError, match=f"holds {common.MAX_ENTRIES} entries, its limit"):
        w.schedule(5, 1)
    assert w.active_count() == 0


def test_nbytes_is_the_same_after_the_same_operations():
    """After the same schedule / cancel / advance sequence, both twins report the same nbytes()
    (the C pool's capacity, doubled from 64, times 32 bytes, plus the slot tables)."""
    c, pure = _pair("wheel")
    wheels = [c.TimerWheel(now_ms=0), pure.TimerWheel(now_ms=0)]
    sizes = []
    for w in wheels:
        seen = [w.nbytes()]
        ids = [w.schedule(10 + i, i) for i in range(100)]
        seen.append(w.nbytes())
        ids += list(w.schedule_many(np.full(1000, 700, dtype=np.int64), np.arange(1000, dtype=np.uint64)))
        seen.append(w.nbytes())
        w.cancel_many(np.array(ids[:500], dtype=np.uint64))
        w.advance(5_000)
        seen.append(w.nbytes())
        sizes.append(seen)
    assert sizes[0] == sizes[1]
    assert sizes[0][0] == common.SLOT_TABLE_BYTES and sizes[0][-1] == 2048 * 32 + common.SLOT_TABLE_BYTES


def _imports_of(path: Path) -> set:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found.add(("." * node.level) + (node.module or ""))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_neither_twin_imports_the_other():
    """The pure twins import only the shared modules (and the asyncio twin the pure wheel), never
    a compiled core; the compiled cores never import a pure twin (checked in the installed sources
    and the compiled modules' globals)."""
    import timerwheel_c.pure as pure_pkg

    compiled = {f"{prefix}_{core}" for prefix in ("timerwheel_c.", "..") for core in ("wheel", "release", "aio")}
    for name in ("wheel", "release", "aio"):
        imports = _imports_of(Path(pure_pkg.__file__).parent / f"{name}.py")
        assert not imports & compiled, imports
        c, _ = _pair(name)
        for value in vars(c).values():
            module = getattr(value, "__module__", None) or ""
            assert not module.startswith("timerwheel_c.pure"), (name, value)


@pytest.mark.parametrize("call", [
    lambda w: w.schedule("5", 1),
    lambda w: w.schedule(5, -1),
    lambda w: w.advance(1.5),
    lambda w: w.cancel_many(np.zeros(2)),
])
def test_compiled_wheel_tracebacks_never_pass_through_the_pure_twin(call):
    """A bad argument to the compiled wheel raises from the shared checks or the core itself: no
    frame of its traceback is in ``timerwheel_c/pure/`` (a reader would think pure was running)."""
    c, _ = _pair("wheel")
    with pytest.raises((TypeError, ValueError)) as info:
        call(c.TimerWheel(now_ms=0))
    files = [frame.filename for frame in traceback.extract_tb(info.value.__traceback__)]
    assert not any(f"timerwheel_c{sep}pure" in f for f in files for sep in "/\\"), files


@pytest.mark.parametrize("method, args", [
    ("schedule", (5,)), ("schedule", ()), ("reschedule", (1,)), ("cancel", ()), ("advance", ()),
    ("advance_array", ()), ("schedule_many", ([1],)), ("cancel_many", ()), ("due_ms", ()),
])
def test_missing_argument_reports_the_same_in_both_twins(method, args):
    """A wheel method called without a required argument raises the same TypeError in C and
    pure, naming the method and the argument."""
    messages = []
    for mod in _pair("wheel"):
        with pytest.raises(TypeError, match=f"TimerWheel.{method}\\(\\) missing required argument") as info:
            getattr(mod.TimerWheel(now_ms=0), method)(*args)
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_reprs_name_time_pending_count_and_implementation():
    """TimerWheel, ReleaseTimer and Deadline reprs say what a debugger needs: the wheel's now_ms and
    pending count, the timer's backend and pending count (or closed), the deadline's at_ns and state,
    and which implementation each is; equal across the twins but for the implementation."""
    for impl, (wheel, release) in (("c", (_pair("wheel")[0], _pair("release")[0])),
                                   ("pure", (_pair("wheel")[1], _pair("release")[1]))):
        w = wheel.TimerWheel(now_ms=7)
        w.schedule(5, 1)
        assert repr(w) == f"<TimerWheel now_ms=7 pending=1 implementation={impl}>"
        with release.ReleaseTimer(backend="condvar") as rt:
            d = rt.arm_ns(time.monotonic_ns() + 3600 * 10**9)
            assert repr(rt) == f"<ReleaseTimer backend=condvar pending=1 implementation={impl}>"
            assert repr(d) == f"<Deadline at_ns={d.at_ns} pending implementation={impl}>"
            past = rt.arm_ns(0)
            assert repr(past) == f"<Deadline at_ns=0 released_at_ns={past.released_at_ns} implementation={impl}>"
        assert repr(rt) == f"<ReleaseTimer backend=condvar closed implementation={impl}>"


@pytest.mark.parametrize("core", ["c", "pure"])
def test_wheel_made_without_now_ms_warns_once_on_a_clock_sized_first_jump(core):
    """TimerWheel() starts at 0 ms; a first advance by more than a day (a clock reading such as
    time.monotonic_ns() // 10**6) warns once, naming the jump; later advances and wheels made
    with now_ms never warn."""
    mod = _pair("wheel")[0 if core == "c" else 1]
    w = mod.TimerWheel()
    assert w.now_ms() == 0
    w.schedule(5, 1)
    with pytest.warns(RuntimeWarning, match="made without now_ms, so it started at 0 ms") as record:
        assert w.advance(common.FIRST_JUMP_WARN_MS + 1) == [1]
    assert len(record) == 1 and str(common.FIRST_JUMP_WARN_MS + 1) in str(record[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w.advance(10 * common.FIRST_JUMP_WARN_MS)
        mod.TimerWheel(now_ms=0).advance(10 * common.FIRST_JUMP_WARN_MS)
        near = mod.TimerWheel()
        near.advance(common.FIRST_JUMP_WARN_MS)  # exactly a day: no warning
        near.advance(10 * common.FIRST_JUMP_WARN_MS)  # not the first advance


@pytest.mark.parametrize("core", ["c", "pure"])
def test_release_timer_refuses_a_deadline_in_wall_clock_seconds(core):
    """arm(time.time() + 0.01) would wait some 55 years on the monotonic clock: a deadline more than
    10 years ahead raises ValueError saying it looks like wall-clock time; nothing is armed."""
    mod = _pair("release")[0 if core == "c" else 1]
    with mod.ReleaseTimer() as rt:
        with pytest.raises(ValueError, match=r"years ahead of time.monotonic_ns\(\).*wall-clock time"):
            rt.arm(time.time() + 0.01)
        with pytest.raises(ValueError, match="wall-clock time"):
            rt.arm_ns(time.time_ns())
        assert rt.pending() == 0
        nine_years = rt.arm_ns(time.monotonic_ns() + 9 * 365 * 86_400 * 10**9)
        assert not nine_years.done() and rt.pending() == 1


@pytest.mark.parametrize("core", ["c", "pure"])
def test_wheels_and_schedulers_refuse_copy_and_pickle_in_both_twins(core):
    """copy.copy, copy.deepcopy and pickle of a TimerWheel, a WheelScheduler, its KeyedTimers, an event
    loop's timer store or one of its handles raise the same TypeError in both twins, naming the type
    and why: a shallow copy of a pure one would share the original's slot lists, so the original
    would fire the copy's timers. The compiled ones raised Cython's own words ("no default
    __reduce__ due to non-trivial __cinit__", "self._slots cannot be converted")."""
    import asyncio
    import copy
    import pickle

    wheel_mod = _pair("wheel")[0 if core == "c" else 1]
    aio_mod = _pair("aio")[0 if core == "c" else 1]
    loop_mod = _pair("loop")[0 if core == "c" else 1]
    wheel = wheel_mod.TimerWheel(now_ms=0)
    wheel.schedule(10, 1)

    async def main():
        sched = aio_mod.WheelScheduler()
        timers = loop_mod.LoopTimers(asyncio.get_running_loop())
        try:
            for obj in (wheel, sched, sched.keyed(print), timers, timers.call_later(30.0, print)):
                for clone in (copy.copy, copy.deepcopy, pickle.dumps):
                    with pytest.raises(TypeError, match=f"^{type(obj).__name__} objects cannot be copied or pickled: "
                                                        "a copy would share the original's timers$"):
                        clone(obj)
        finally:
            sched.close()
            timers.close()

    asyncio.run(main())
    assert wheel.advance(20) == [1]


def test_asyncio_twins_take_their_shared_constants_from_the_neutral_module():
    """NO_WAKE, IN_BATCH, KEYED_SWEEP_MIN and MAX_DUE_MS are defined once: both asyncio twins hold the neutral
    module's objects (the compiled one copies them into int64 C variables at import, so NO_WAKE
    must fit in an int64), and MAX_DUE_MS is the wheel's own."""
    c, pure = _pair("aio")
    assert aio_common.MAX_DUE_MS is common.MAX_DUE_MS == 2**62
    assert aio_common.NO_WAKE == 2**63 - 1 and aio_common.IN_BATCH == -1
    for name in ("NO_WAKE", "IN_BATCH", "KEYED_SWEEP_MIN", "MAX_DUE_MS"):
        assert getattr(pure, name) is getattr(aio_common, name), name
        assert getattr(c, f"_{name}") is getattr(aio_common, name), name


def _compiled_defs(path: Path) -> list:
    """(class, method) names in source order in a .pyx, its ``include`` files inlined."""
    defs, cls = [], None
    for line in path.read_text().splitlines():
        include = re.match(r'include "(.+)"', line)
        if include:
            defs += _compiled_defs(path.parent / include.group(1))
            continue
        klass = re.match(r"(?:cdef )?class (\w+)", line)
        if klass:
            cls = klass.group(1)
        elif re.match(r"(?:cdef|cpdef|def) ", line):
            cls = None  # a module-level function ends the class
        elif cls:
            method = re.match(r"    (?:def|cdef|cpdef) (?:[\w*]+ )*?(\w+)\(self", line)
            if method:
                defs.append((cls, method.group(1)))
    return defs


def _pure_defs(path: Path) -> list:
    tree = ast.parse(path.read_text())
    return [(node.name, item.name) for node in tree.body if isinstance(node, ast.ClassDef)
            for item in node.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_asyncio_pure_twin_follows_the_compiled_module_class_by_class_method_by_method():
    """pure/aio.py has the classes and methods of src/_aio.pyx (with its includes) in the same
    order, so the two diff by eye. The compiled module's C-level methods map to the twin's private
    ones (c_reschedule -> _reschedule...); what exists only in C (allocation, the clock read in C,
    the key table's open addressing, the ready awaitable) or only in Python is left out. Read from the checkout's sources: skipped where only the installed package is."""
    import timerwheel_c.pure as pure_pkg

    pyx = CHECKOUT / "src" / "_aio.pyx"
    if not pyx.is_file():
        pytest.skip("the checkout's src/ is not here")
    to_pure = {"c_reschedule": "_reschedule", "c_cancel": "_cancel", "c_arm": "_arm"}
    c_only = {"__cinit__", "__dealloc__", "c_time", "c_call_later", "_home", "_find", "_insert",
              "_remove", "_grow", "_Ready"}
    compiled = [(cls, to_pure.get(name, name)) for cls, name in _compiled_defs(pyx)
                if cls not in c_only and name not in c_only]
    pure = [(cls, name) for cls, name in _pure_defs(Path(pure_pkg.__file__).parent / "aio.py")
            if name != "_init"]
    assert compiled == pure
    assert [cls for cls, _ in compiled] and {cls for cls, _ in compiled} == set(_pair("aio")[1].__all__)


@pytest.mark.parametrize("call", [
    lambda s: s.call_later("1", print),
    lambda s: s.call_later(1.0, 5),
    lambda s: s.call_at(float("nan"), print),
    lambda s: s.timeout("1"),
    lambda s: s.timeout_at(float("inf")),
    lambda s: s.keyed(print).arm(2**63, 1.0),
    lambda s: s.keyed(print).arm(True, 1.0),
    lambda s: s.keyed(print).cancel("k"),
    lambda s: type(s.call_later(1.0, print))(),
    lambda s: type(s.keyed(print))(),
])
def test_asyncio_twins_refuse_bad_input_with_the_same_exception(call):
    """Both asyncio twins raise the same exception type with the same message for the same bad
    argument, and the compiled one's traceback never passes through the pure twin."""
    outcomes = []

    async def main(mod):
        sched = mod.WheelScheduler()
        try:
            with pytest.raises((TypeError, ValueError)) as info:
                call(sched)
            return info
        finally:
            sched.close()

    for mod in _pair("aio"):
        info = asyncio.run(main(mod))
        outcomes.append((type(info.value), str(info.value)))
        if mod.__name__ == "timerwheel_c._aio":
            files = [frame.filename for frame in traceback.extract_tb(info.value.__traceback__)]
            assert not any(f"timerwheel_c{sep}pure" in f for f in files for sep in "/\\"), files
    assert outcomes[0] == outcomes[1]
