"""The timer layer: timer rows as store keys, handlers and their registry, the runner's phases,
the writer, and durable sleep. It imports only the storage layer below it."""
