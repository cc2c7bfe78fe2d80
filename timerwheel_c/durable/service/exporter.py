"""Prometheus metrics and a health check for a :class:`DurableTimerService`.

In an application that already serves Prometheus metrics, register the service's figures in
its own registry (the library formats them; nothing is served by this module then)::

    from prometheus_client import REGISTRY
    from timerwheel_c.durable.service.exporter import register
    register(service)            # or register(service, my_registry)

Standalone (``timerwheel-c run --metrics-port PORT``), :func:`serve` starts a small HTTP
server on a daemon thread with:

- ``/metrics``: the figures of :mod:`~timerwheel_c.durable.service.metrics` in Prometheus
  text format (those by kind labelled with its number and its name, ``kind_name``), written by ``prometheus_client`` (a custom collector reading
  :meth:`DurableTimerService.metrics` at each scrape);
- ``/healthz``: (GET or HEAD, as each path) 200 ``ok`` while the service thread is alive and a pass's claim round trip
  last succeeded within ``stale_after_s`` (default :func:`default_stale_after_s`: twice the
  service's longest sleep plus 10 s, 70 s for the default 30 s sleep; an idle service passes
  at least once per sleep, and a failing store is retried within 5 s), or every handler slot
  is busy (no pass for want of room is work, not a stall). Otherwise 503 with a one-line reason:
  the thread is not running, the store has not answered a pass for so long, or every slot is
  held by a sync call past its handler's ``timeout_s`` (its thread cannot be stopped: a restart
  ends it). It fits Kubernetes' liveness and
  readiness probes (a probe's ``timeoutSeconds`` above 2 s: a scrape waits that long at most
  for the store).

``prometheus_client`` is the optional extra ``timerwheel_c[metrics]``; without it,
:func:`register` and :func:`serve` raise ImportError saying so. Sources: Prometheus'
exposition format and ``prometheus_client``'s custom collectors; Kubernetes' HTTP probes.
"""
from __future__ import annotations

from typing import Optional, Tuple

from .web_http import PageHandler, WebServer, bind

__all__ = ["MetricsServer", "check_address", "collector", "default_stale_after_s", "health", "register", "serve"]

_MISSING = ("timerwheel_c's Prometheus metrics need prometheus_client, which is not installed: "
            "pip install 'timerwheel_c[metrics]'")


def _prometheus():
    try:
        import prometheus_client
        from prometheus_client import core
    except ModuleNotFoundError as exc:
        if exc.name != "prometheus_client":
            raise
        raise ModuleNotFoundError(_MISSING, name="prometheus_client") from exc
    return prometheus_client, core


def default_stale_after_s(service) -> float:
    """Seconds (float) after which a service with no clean pass or store round trip is unhealthy:
    ``2 * service.max_sleep_s + 10``."""
    return 2 * service.max_sleep_s + 10.0


def health(service, stale_after_s: Optional[float] = None) -> Tuple[bool, str]:
    """``(healthy, one-line reason)`` of ``service`` (see the module docstring)."""
    bound_s = default_stale_after_s(service) if stale_after_s is None else stale_after_s
    if not service.running:
        died = service.died
        return False, "service thread not running" + ("" if died is None else f": {type(died).__name__}")
    m = service.metrics(backlog_timeout_s=0)
    age_s = m.last_progress_age_s
    if (age_s is None or age_s > bound_s) and m.handlers_overdue >= service.concurrency:
        # Every slot held by a call that timed out and never returned: no pass will come, and only
        # a restart ends those threads.
        return False, (f"all {service.concurrency} handler slot(s) held by calls past their handler's timeout_s "
                       "(a sync call's thread, or an async call that ignores its cancel, cannot be stopped: restart the process)")
    if age_s is not None and age_s > bound_s and m.handlers_in_flight >= service.concurrency:
        # No pass for want of a free slot, not for a stuck thread or store: it passes again when a
        # handler returns.
        return True, f"ok: all {service.concurrency} handler slot(s) busy"
    if age_s is None:
        return False, "no store round trip yet"
    if age_s > bound_s:
        return False, f"no clean pass or store round trip for {age_s:.1f} s (bound {bound_s:.1f} s)"
    return True, "ok"


def collector(service):
    """A ``prometheus_client`` collector of ``service``'s figures, read at each collection.

    Raises:
        ImportError: ``prometheus_client`` is not installed (the message says how to install it).
    """
    _, core = _prometheus()

    class _Collector:
        def describe(self):
            # The registry checks the names describe() gives against those it holds, so a second
            # service registered in one registry is refused instead of duplicating every series.
            return list(self.collect())

        def collect(self):
            m = service.metrics()
            for name, doc, by_kind in (
                    ("timerwheel_fired", "Durable timer outcomes committed (Done or Reschedule), by kind", m.fired),
                    ("timerwheel_failed", "Durable timer fires that failed and backed off, by kind", m.failed),
                    ("timerwheel_parked", "Durable timers parked after their last attempt, by kind", m.parked)):
                family = core.CounterMetricFamily(name, doc, labels=["kind", "kind_name"])
                for kind in sorted(set(by_kind) | set(m.parked)):
                    family.add_metric([str(kind), m.kind_names.get(kind, "")], by_kind.get(kind, 0))
                yield family
            late = m.lateness
            hist = core.HistogramMetricFamily("timerwheel_lateness_seconds",
                                              "Fire time minus due time of first attempts, in seconds")
            hist.add_metric([], [(_bound(b), n) for b, n in late.buckets], late.sum_s)
            yield hist
            took = m.handler_duration
            hist = core.HistogramMetricFamily("timerwheel_handler_seconds", "Handler call durations, in seconds")
            hist.add_metric([], [(_bound(b), n) for b, n in took.buckets], took.sum_s)
            yield hist
            # A service reading the store by shard counts by shard: a series per shard, never one per partition.
            by, due, parked = (("shard", m.due_backlog_by_shard, m.parked_timers_by_shard)
                               if m.due_backlog_by_shard or m.parked_timers_by_shard else
                               ("partition", m.due_backlog, m.parked_timers))
            yield _by_label(core.GaugeMetricFamily("timerwheel_due_backlog", f"Timer rows due now, by served {by}",
                                                   labels=[by]), due)
            yield _by_label(core.GaugeMetricFamily("timerwheel_parked_timers", f"Timers parked now, by served {by}",
                                                   labels=[by]), parked)
            yield core.GaugeMetricFamily("timerwheel_owned_partitions", "Partitions this runner serves now (serving the whole store: shards)",
                                         value=m.owned_partitions)
            yield _by_label(core.CounterMetricFamily("timerwheel_store_errors", "Failed store calls, by class",
                                                     labels=["class"]), m.store_errors)
            yield core.GaugeMetricFamily("timerwheel_handlers_in_flight", "Handlers running now",
                                         value=m.handlers_in_flight)

    return _Collector()


def _by_label(family, values: dict):
    """``family`` with one sample per ``(label, value)`` of ``values``, in label order."""
    for label, n in sorted(values.items()):
        family.add_metric([str(label)], n)
    return family


def _bound(bound_s: float) -> str:
    return "+Inf" if bound_s == float("inf") else repr(bound_s)


def register(service, registry=None):
    """Register ``service``'s figures in ``registry`` (default: ``prometheus_client.REGISTRY``);
    returns the collector (pass it to ``registry.unregister`` to undo). One service per registry:
    the series carry no label of the service.

    Raises:
        ImportError: ``prometheus_client`` is not installed.
        ValueError: ``registry`` already holds these series (another service was registered in it).
    """
    prometheus_client, _ = _prometheus()
    registry = prometheus_client.REGISTRY if registry is None else registry
    c = collector(service)
    registry.register(c)
    return c


#: The HTTP server :func:`serve` started: ``host``, ``port`` (the bound one, for port 0), ``close()``.
MetricsServer = WebServer


def check_address(port: int, host: str = "127.0.0.1") -> None:
    """Check that :func:`serve` could bind ``host:port`` now (binding it and letting it go), before a
    command creates anything: ``timerwheel-c run`` checks every argument before it opens the store.

    Raises:
        ImportError: ``prometheus_client`` is not installed.
        OSError: the address cannot be bound (e.g. the port is taken).
    """
    _prometheus()
    bind(host, port).server_close()


def serve(service, port: int, host: str = "127.0.0.1", stale_after_s: Optional[float] = None,
          page=None) -> MetricsServer:
    """Serve ``/metrics`` and ``/healthz`` for ``service`` on ``host:port`` (port 0: any free one)
    from a daemon thread, and ``page`` (a :class:`~.web.StatusPage`) at ``/`` when given.
    Loopback by default: pass ``host="0.0.0.0"`` for a scraper elsewhere.

    Raises:
        ImportError: ``prometheus_client`` is not installed.
        OSError: the address cannot be bound (e.g. the port is taken).
    """
    prometheus_client, core = _prometheus()
    registry = core.CollectorRegistry(auto_describe=False)
    registry.register(collector(service))

    def metrics() -> tuple:
        return 200, prometheus_client.CONTENT_TYPE_LATEST, prometheus_client.generate_latest(registry)

    def healthz() -> tuple:
        ok, reason = health(service, stale_after_s)
        return (200 if ok else 503), "text/plain; charset=utf-8", (reason + "\n").encode()

    handler = type("MetricsHandler", (PageHandler,), {"page": page, "routes": {"/metrics": metrics, "/healthz": healthz},
                                                     "not_found": b"not found: try /metrics or /healthz\n"})
    return WebServer(handler, port, host, "timerwheel-metrics")
