"""The service layer: the background service that fires durable timers, partition ownership in a
fleet, and ``timerwheel-c run``. It imports the timer and storage layers below it.

Importing it gives PostgreSQL stores their :attr:`~timerwheel_c.durable.storage.store.Store.ownership_type`
(the fair share of :mod:`.ownership`), when psycopg is installed: the storage layer offers the
advisory locks, this layer the policy that divides partitions with them.
"""
try:
    from .ownership import PartitionOwnership
except ModuleNotFoundError as exc:  # no psycopg: no PostgresStore exists to divide
    if exc.name != "psycopg":
        raise
else:
    from ..storage.postgres import PostgresStore

    PostgresStore.ownership_type = PartitionOwnership
