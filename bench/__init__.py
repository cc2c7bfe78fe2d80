"""The side-by-side benchmarks behind ``python bench/run.py``, against the installed timerwheel_c.

How a run flows: :mod:`.cli` parses the options and builds a :class:`.suite.Context`;
every workload selected by ``--only`` is measured into plain, JSON-ready figures
(:data:`.suite.WORKLOADS`); then the tables (:mod:`.tables`, printed by
:mod:`.report`), ``--json`` and ``--plot`` (:mod:`.plot`) all read those same
figures. Printing computes nothing, so the JSON never depends on it.

The modules, one concept each:

- :mod:`.suite`: the list of workloads, each a name, a measurement, a table, a
  progress total and its goals;
- :mod:`.goals`: a goal judged on a figure, and the one way it is shown (goal,
  measured, met / NOT met / n/a);
- :mod:`.preflight`: what is checked before the first workload (output paths,
  the ``--pg-dsn`` server);
- :mod:`.harness`: the timing method (thread CPU time, warm-up, repeats), the one
  percentile definition (:func:`.harness.summary`, numpy's), and the fired-set check;
- :mod:`.impls`: the rows (C wheel, pure twin, asyncio, uvloop, heapq, the empty
  floor); compiled rows exist only when :mod:`timerwheel_c._impl` chose the compiled
  cores, so ``TIMERWHEEL_C_NO_EXTENSIONS=1`` benches the pure twins alone;
- :mod:`.workloads` (churn, expiry, mixed RTO, long gap), :mod:`.memory`,
  :mod:`.lateness`, :mod:`.durable` (on PostgreSQL also :mod:`.fleet`, and :mod:`.peers`: the
  fleet beside pgqueuer, :mod:`.pgqueuer_peer`, with the CPU split of :mod:`.cpu_split`),
  :mod:`.durable_partitions` (the wake-up among up to 100,000 idle partitions),
  :mod:`.network` (with :mod:`.network_server`),
  :mod:`.aio_micro` (the asyncio layer per operation) and :mod:`.echo` (with
  :mod:`.echo_server`: a lean echo server whose CPU per request the timers show in):
  the measurements;
- :mod:`.machine`: the facts a figure is meaningless without.

Adding a workload:

1. write its measurement in a module here, a function returning plain values with
   the unit in every key (``fired_per_s``, ``lateness_ms``, ``latency_us``), and
   summarise samples with :func:`.harness.summary`;
2. write its table in :mod:`.tables`: ``table(rep, figures)``, reading only the figures;
3. add one :class:`.suite.Workload` line to :data:`.suite.WORKLOADS`; if it has goals,
   pass ``goals=``: a function of its figures returning ``[(Goal(...), measured), ...]``
   (measured None where the figure does not apply).

``--only NAME``, ``--json``, the progress bar, failure isolation and "not available"
lines (raise :class:`.harness.NotAvailable` from the measurement) then follow, and a
test in ``tests/benchmarks/test_bench_cli.py`` can run it at ``--scale 0.002``.
"""
