"""The timer layer: timer rows as store keys, handlers and their registry, the runner's phases,
the writer, durable sleep, and recurring schedules' triggers and state. It imports only the
storage layer below it."""
