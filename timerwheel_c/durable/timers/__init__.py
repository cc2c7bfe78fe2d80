"""The timer layer: timer rows as store keys, handlers and their registry, the runner's phases,
the writer, durable sleep, and recurring schedules' triggers and state. It imports only the
storage layer below it."""
from . import key_upgrade  # noqa: F401  (registers the store's rewrite into the reserved key space)
