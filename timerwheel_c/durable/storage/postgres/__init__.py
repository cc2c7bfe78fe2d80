"""The PostgreSQL backend (the ``postgres`` extra: psycopg 3 and psycopg_pool), in one folder as
procrastinate keeps its connectors: the store (:mod:`.store`), its SQL (``sql/``), the asyncio
pools (:mod:`.pool`), writes in the caller's transaction (:mod:`.joined`), partition ownership
(:mod:`.ownership`), the change signal (:mod:`.listen`), bulk ``COPY`` (:mod:`.copy`) and the
array dumpers (:mod:`.arrays`). Importing it imports psycopg; nothing outside ``storage/`` does.
"""
from .store import SCHEMA_VERSION, PostgresStore

__all__ = ["SCHEMA_VERSION", "PostgresStore"]
