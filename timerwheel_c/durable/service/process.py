"""Process-wide settings for a process that exists to run durable timers: ``timerwheel-c run``, a
fleet's runner, a worker started for nothing else.

CPython's cyclic garbage collector collects generation 0 after every 700 net allocations of
container objects, generation 1 after every 10 of those and, after every 10 of those, the whole
heap (``gc.get_threshold()``: ``(700, 10, 10)``). A runner builds a few dozen short-lived
containers per timer it fires (records, batches, tuples), nearly all freed at once by reference
counting, so at thousands of fires per second the collector ran hundreds of times per second, and
each full collection walked every object the imports had built (about 40,000). In the fleet bench
that was 20 to 35 % of a runner's CPU time per fired timer.

:func:`prepare_process` does what long-running Python servers do: it moves every object built so
far (modules, classes, the handlers' registry) to the collector's permanent generation with
:func:`gc.freeze`, which CPython's documentation recommends for exactly this, and raises the
thresholds to :data:`GC_THRESHOLDS`, so that a collection runs per tens of thousands of
allocations rather than per hundreds. Reference cycles are still collected, later; the memory they
hold meanwhile is bounded by the threshold (tens of thousands of objects).

These settings belong to the process, not to a library inside it: the service never changes them
on its own. ``timerwheel-c run`` calls :func:`prepare_process` once its handlers are loaded; an
application that runs :class:`~.service.DurableTimerService` in a process of its own may do the
same.
"""
from __future__ import annotations

import gc
import logging

__all__ = ["GC_THRESHOLDS", "prepare_process"]

log = logging.getLogger("timerwheel_c.durable")

#: The collector's thresholds :func:`prepare_process` sets: generation 0 collected after 50,000
#: net container allocations (not 700), generations 1 and 2 after 20 collections of the one below.
GC_THRESHOLDS = (50_000, 20, 20)


def prepare_process() -> tuple:
    """Freeze the objects built so far out of the cyclic collector's reach (:func:`gc.freeze`) and
    set its thresholds to :data:`GC_THRESHOLDS`; returns the thresholds it replaced, a 3-tuple
    (``gc.set_threshold(*previous)`` and :func:`gc.unfreeze` undo it). Call it once, after the
    imports and the handlers' registry, before the service starts. Raises nothing."""
    previous = gc.get_threshold()
    gc.collect()  # what is garbage now is not frozen with the rest
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    log.debug("garbage collector: %d objects frozen, thresholds %s (were %s)", gc.get_freeze_count(),
              GC_THRESHOLDS, previous)
    return previous
