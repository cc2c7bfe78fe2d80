"""Migrated PostgresStore tables lent to one test at a time, so that a PostgreSQL test costs a TRUNCATE
instead of a CREATE of the table, its meta table, view, trigger and functions (the migrations) and a
DROP of all of them, which together took most of a fast PostgreSQL test's time.

``TablePool(dsn)`` belongs to one test process (one pytest-xdist worker): its table names hold a
random run id, so two workers or two runs on one server never share a table, its lock keys or its
NOTIFY channel. ``take()`` returns the name of a table no other test holds: the store's whole schema
at the current version, with no rows, no labels and the meta rows it had when it was created.
``give_back(name)`` empties it for the next test, or drops it when the test changed its schema (a
reshard, a trigger or function of its own, a grant, a column): a test that changes what TRUNCATE does
not restore never leaves that to another. ``close()`` drops every table the pool made.

``counted_store(dsn, prefix)`` is a context manager for a test that reads the server's statistics
counters of its table instead: a PostgresStore on a fresh table of its own, named ``<prefix>_<random>``
(a pooled table's counters would hold earlier tests' reads and writes), skipping the test on a server
older than PostgreSQL 15 (``pg_stat_force_next_flush()``), dropped afterwards.
"""
from __future__ import annotations

import contextlib
import uuid
from typing import Iterator

import psycopg
from psycopg import sql

from bench.stores import OWNED_BY_TABLE as _OWN, TABLE_FUNCTIONS, dispose

# What a TRUNCATE does not restore, by identity (oids), so that a dropped and re-made object counts too;
# the triggers by name only, as a declaration of the change signal rewrites the wake trigger's condition.
_FINGERPRINT = sql.SQL("""
SELECT string_agg(x, E'\\n' ORDER BY x) FROM (
  SELECT format('rel %%s %%s %%s %%s', c.oid, c.relname, c.relkind, c.relacl) AS x FROM pg_class c
   WHERE """ + _OWN.format(name="c.relname", space="c.relnamespace") + """
  UNION ALL
  SELECT format('col %%s %%s %%s %%s', a.attrelid, a.attname, format_type(a.atttypid, a.atttypmod),
                pg_get_expr(d.adbin, d.adrelid))
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
   WHERE a.attnum > 0 AND NOT a.attisdropped AND """ + _OWN.format(name="c.relname", space="c.relnamespace") + """
  UNION ALL
  SELECT format('fn %%s %%s %%s', p.oid, md5(pg_get_functiondef(p.oid)), p.proacl) FROM pg_proc p
   WHERE """ + _OWN.format(name="p.proname", space="p.pronamespace") + """
  UNION ALL
  SELECT format('trg %%s', g.tgname) FROM pg_trigger g WHERE g.tgrelid = to_regclass(%(t)s) AND NOT g.tgisinternal
) s""")

_TRIGGERS = sql.SQL("SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE tgrelid = to_regclass(%(t)s) "
                    "AND NOT tgisinternal ORDER BY tgname")

_FUNCTIONS = sql.SQL(TABLE_FUNCTIONS)


class TablePool:
    """Tables of one test process on the server of ``dsn`` (a libpq DSN or URL); see the module."""

    def __init__(self, dsn: str):
        self._dsn = dsn
        self._run = uuid.uuid4().hex[:8]
        self._made = 0
        self._free: list = []
        self._snapshots: dict = {}  # name -> (fingerprint, meta rows, trigger definitions) when made
        self._conn = None

    def _admin(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._dsn, autocommit=True)
            # A connection a test left open on its table must not hang the run: the table is dropped later.
            self._conn.execute("SET lock_timeout = '5s'")
        return self._conn

    def _state(self, name: str) -> tuple:
        conn = self._admin()
        args = {"t": name}
        fingerprint = conn.execute(_FINGERPRINT, args).fetchone()[0]
        meta = conn.execute(sql.SQL("SELECT name, value FROM {} ORDER BY name").format(
            sql.Identifier(f"{name}_meta"))).fetchall()
        return fingerprint, meta, conn.execute(_TRIGGERS, args).fetchall()

    def take(self) -> str:
        """The name of an empty, migrated table of this pool, made if none is free."""
        if self._free:
            return self._free.pop()
        from timerwheel_c.durable.storage.postgres import PostgresStore

        self._made += 1
        name = f"twp_{self._run}_{self._made:04d}"
        PostgresStore(self._dsn, table=name).close()
        self._snapshots[name] = self._state(name)
        return name

    def give_back(self, name: str) -> None:
        """Empty the table ``name`` (from :meth:`take`) for the next test, restoring its meta rows
        and triggers, or drop it when its schema changed or it cannot be emptied now."""
        fingerprint, meta, triggers = self._snapshots[name]
        conn = self._admin()
        try:
            with conn.transaction():
                now = conn.execute(_FINGERPRINT, {"t": name}).fetchone()[0]
                if now != fingerprint:
                    raise LookupError(f"table {name} changed its schema")
                conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(name)))
                meta_table = sql.Identifier(f"{name}_meta")
                conn.execute(sql.SQL("DELETE FROM {}").format(meta_table))
                with conn.cursor() as cur:
                    cur.executemany(sql.SQL("INSERT INTO {} (name, value) VALUES (%s, %s)").format(meta_table), meta)
                if conn.execute(_TRIGGERS, {"t": name}).fetchall() != triggers:
                    for trigger, definition in triggers:
                        conn.execute(sql.SQL("DROP TRIGGER {} ON {}").format(sql.Identifier(trigger),
                                                                             sql.Identifier(name)))
                        conn.execute(definition)
        except (LookupError, psycopg.Error):
            self._drop(name)
            return
        self._free.append(name)

    def _drop(self, name: str) -> None:
        """Drop the table ``name`` and every object named after it; one that a test left locked stays."""
        del self._snapshots[name]
        conn = self._admin()
        try:
            with conn.transaction():
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}, {} CASCADE").format(
                    sql.Identifier(name), sql.Identifier(f"{name}_meta")))
                for (function,) in conn.execute(_FUNCTIONS, {"t": name}).fetchall():
                    conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {} CASCADE").format(sql.SQL(function)))
        except psycopg.Error:
            pass

    def close(self) -> None:
        """Drop every table this pool made and close its connection."""
        for name in list(self._snapshots):
            self._drop(name)
        self._free.clear()
        if self._conn is not None:
            self._conn.close()


@contextlib.contextmanager
def counted_store(dsn: str, prefix: str) -> Iterator:
    """See the module docstring."""
    import pytest

    from timerwheel_c.durable.storage.postgres import PostgresStore

    store = PostgresStore(dsn, table=f"{prefix}_{uuid.uuid4().hex[:12]}")
    if store._connection().info.server_version < 150000:
        store.close()
        pytest.skip("pg_stat_force_next_flush() needs PostgreSQL 15")
    try:
        yield store
    finally:
        dispose(store)
