"""The service layer: the background service that fires durable timers, partition ownership in a
fleet, and ``timerwheel-c run``. It imports the timer and storage layers below it."""
