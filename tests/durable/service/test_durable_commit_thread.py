"""Where a runner commits its outcomes: a runner that serves the whole store alone commits on a
thread and connection of their own, beside its claims (their round trips overlap, and the server
runs both at once); a runner that may share the store with others (pinned to a list of partitions,
or one of several in a fleet) keeps claims and commits on its one store thread, unless told
``separate_commits=True``.

Each test fires timers through a store whose second handles (``open_sibling``, which SQLite itself
does not give) record the thread every write runs on, and first checks that the timers fired and
that writes were recorded, so that "no commit on a thread of its own" cannot pass vacuously. It
waits only for the timers' outcomes, never for a length of time."""
from __future__ import annotations

import os
import threading

import pytest

from timerwheel_c.durable.service.service import DurableTimerService
from timerwheel_c.durable.storage.sqlite import SQLiteStore
from timerwheel_c.durable.storage.store import Batch
from timerwheel_c.durable.timers import keys
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerKind, TimerRegistry
from waiting import wait_until, wall_ms

P = "commits"
KIND = 0xE4
TIMERS = 20


class Effect(TimerHandler):
    kind = TimerKind(KIND)

    def fire(self, ctx, timer):
        return Done(Batch().put(b"effect/" + timer.reference, b"1"))


class NotesThreads:
    """A store mixin: each write (``apply_across``, a claim's or a commit's) notes the name of the
    thread it ran on in ``self.threads``."""

    threads: list

    def apply_across(self, items):
        self.threads.append(threading.current_thread().name)
        return super().apply_across(items)  # type: ignore[misc]


class Recording(NotesThreads, SQLiteStore):
    """A SQLiteStore whose second handles are stores of their own on the same file, noting threads."""

    def __init__(self, path, threads: list):
        super().__init__(path)
        self.path_given = path
        self.threads = threads

    def open_sibling(self, *, lock_wait_ms=None):
        super().open_sibling(lock_wait_ms=lock_wait_ms)  # checks the bound as every store does
        return Recording(self.path_given, self.threads)


def _fire_all(tmp_path, partitions, **kwargs) -> list:
    """Fire TIMERS due timers with a service over ``partitions``; returns the threads that wrote."""
    threads: list = []
    store = Recording(tmp_path / "commits.db", threads)
    try:
        for i in range(TIMERS):
            store.apply(P, Batch().put(keys.timer(wall_ms() - 1, KIND, b"t%02d" % i), b""))
        with DurableTimerService(store, TimerRegistry().register(Effect()), partitions, **kwargs):
            wait_until(lambda: all(store.get(P, b"effect/t%02d" % i) is not None for i in range(TIMERS)),
                       "every timer's outcome to commit")
            wait_until(lambda: store.scan(P, *keys.timer_range()).entries == [], "every timer row to go")
        return list(threads)
    finally:
        store.close()


def test_a_runner_serving_the_whole_store_alone_commits_on_a_thread_of_its_own(tmp_path):
    threads = _fire_all(tmp_path, None)
    assert any(name.startswith("durable-store") for name in threads)  # the claims
    assert any(name.startswith("durable-commit") for name in threads), threads


def test_a_runner_pinned_to_partitions_commits_on_its_store_thread(tmp_path):
    threads = _fire_all(tmp_path, [P])
    assert any(name.startswith("durable-store") for name in threads)
    assert not any(name.startswith("durable-commit") for name in threads), threads


def test_separate_commits_commit_on_a_thread_of_their_own_whatever_the_runner_serves(tmp_path):
    threads = _fire_all(tmp_path, [P], separate_commits=True)
    assert any(name.startswith("durable-commit") for name in threads), threads


PG_DSN = os.environ.get("TIMERWHEEL_C_TEST_PG_DSN")


def _recording_pg(table: str, threads: list):
    """A PostgresStore noting the thread of each write (its second handles are copies of it)."""
    from timerwheel_c.durable.storage.postgres import PostgresStore

    class RecordingPg(NotesThreads, PostgresStore):
        pass

    store = RecordingPg(PG_DSN, table=table)
    store.threads = threads
    return store


@pytest.mark.skipif(not PG_DSN, reason="no TIMERWHEEL_C_TEST_PG_DSN")
@pytest.mark.parametrize("partitions", [[P, "other"], None], ids=["partitions", "shards"])
def test_a_fleet_runner_commits_apart_only_while_it_owns_the_whole_store(pg_table, partitions):
    """Alone in its fleet a runner owns every partition (or shard) and commits on a thread of its own;
    once a second runner has taken its share, each commits on its store thread."""
    first_threads: list = []
    second_threads: list = []
    first, second = _recording_pg(pg_table, first_threads), _recording_pg(pg_table, second_threads)
    registry = TimerRegistry().register(Effect())
    try:
        with DurableTimerService(first, registry, partitions, fleet=True) as one:
            for i in range(TIMERS):
                first.apply(P, Batch().put(keys.timer(wall_ms() - 1, KIND, b"a%02d" % i), b""))
            wait_until(lambda: first.get(P, b"effect/a%02d" % (TIMERS - 1)) is not None, "the first runner's outcomes")
            assert any(name.startswith("durable-commit") for name in first_threads), first_threads
            with DurableTimerService(second, registry, partitions, fleet=True) as two:
                assert one.ownership is not None and two.ownership is not None
                wait_until(lambda: one.ownership.last_owned() and two.ownership.last_owned(),
                           "the two runners to share the store")
                del first_threads[:], second_threads[:]
                for p in (P, "other"):
                    for i in range(TIMERS):
                        first.apply(p, Batch().put(keys.timer(wall_ms() - 1, KIND, b"b%02d" % i), b""))
                wait_until(lambda: all(first.get(p, b"effect/b%02d" % i) is not None
                                       for p in (P, "other") for i in range(TIMERS)), "both runners' outcomes")
                # Two members divide the store once and keep their shares while both live.
                assert one.ownership.last_owned() and two.ownership.last_owned()
        assert first_threads or second_threads
        assert not any(name.startswith("durable-commit") for name in first_threads + second_threads), \
            (first_threads, second_threads)
    finally:
        first.close()
        second.close()
