"""The service layer: the background service that fires durable timers, partition ownership in a
fleet (the policy a backend gives through :meth:`~timerwheel_c.durable.storage.store.Store.ownership`),
and ``timerwheel-c run``. It imports the timer and storage layers below it, and no driver.
"""
