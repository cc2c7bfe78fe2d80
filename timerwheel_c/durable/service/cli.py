"""``timerwheel-c run``: serve durable timers from a store until SIGINT or SIGTERM.

    python -m timerwheel_c run --store sqlite:////abs/timers.db --handlers pkg.mod:registry [--partition NAME ...] [--concurrency N]

``--handlers`` names a :class:`TimerRegistry` (or a zero-argument callable returning one) as
``module:attribute``. Without ``--partition`` every partition in the store is served; on
PostgreSQL, runners started that way (on any number of hosts) form a fleet and divide the
partitions among themselves, each served by one live runner at a time. ``--partition``
pins a runner to the partitions it names.

The store URL comes from ``--store``, or from the environment variable ``TIMERWHEEL_C_STORE``
when ``--store`` is absent. On PostgreSQL, a URL without a password (``postgresql://app@db/timers``)
lets libpq find it in ``PGPASSWORD``, ``PGPASSFILE`` (default ``~/.pgpass``) or a service file
(``PGSERVICE``): the way to keep a password out of ``ps`` and the shell's history.

``--metrics-port PORT`` serves ``/metrics`` (Prometheus text format) and ``/healthz`` on
``--metrics-host`` (default 127.0.0.1, loopback; needs ``pip install 'timerwheel_c[metrics]'``);
see :mod:`timerwheel_c.durable.service.exporter`. It serves the live status page at ``/`` too
(see ``timerwheel-c web --help``), and with ``--web-actions`` the page's buttons that change state.
``--release-claims-on-stop`` makes this runner's unsettled claims due at once on SIGINT/SIGTERM,
for another runner to take without waiting out their backoff; a handler still running here may
then overlap with its retry there.

On SIGINT/SIGTERM the handlers in flight get 10 s (``STOP_S``) to finish and commit; a handler
still running then is abandoned (its row stays claimed, as :meth:`DurableTimerService.stop` says).
The process ends within 15 s (``STOP_S`` + ``EXIT_GRACE_S``) of the signal, also when the store
does not answer: past that it ends without closing it, with a WARNING naming what it waited for.
A signal received while the service starts stops it too.

Exit status: 0 after a stop (SIGINT/SIGTERM); 1, logged with its cause, if the
service's thread ever ends without a stop; 2, with one line on stderr naming the offending
value, on a bad argument: a handlers module that cannot be imported (or raises while
importing; its traceback is logged at DEBUG), a registry with no handler, or a store that cannot be opened at
startup (an unopenable path, a file that is not a database, a refused PostgreSQL
connection). Every argument is checked before the store is opened, so a bad one never
leaves a new database file behind. Store errors after startup never end the process: the
service logs them and retries.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import logging
import os
import sys
import threading
from typing import Optional

from ..._helptext import terminal_text
from ..timers.registry import TimerRegistry
from .pool import DEFAULT_CONCURRENCY, MAX_CONCURRENCY
from ..storage.printable import printable
from ..storage.redact import redact
from .cli_text import first_line
from .logs import log_to_stderr

log = logging.getLogger("timerwheel_c.durable")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
STORE_ENV = "TIMERWHEEL_C_STORE"
#: Seconds a stop gives the handlers in flight and the commit of their outcomes (``service.stop``'s timeout).
STOP_S = 10.0
#: Seconds more for the rest of a stop (the service thread's teardown, closing the metrics server and
#: the store) before the process ends without waiting for it.
EXIT_GRACE_S = 5.0
_START_POLL_S = 0.01  # how often a signal is looked for while the service starts


class HandlersError(ValueError):
    """``--handlers`` names no usable TimerRegistry: not ``module:attribute``, a module that
    fails to import (or raises while importing), a missing attribute, or not a registry.
    The message names the spec; the original exception is chained as ``__cause__``."""


def add_parser(sub) -> None:
    """Register the ``run`` subcommand on an argparse subparsers object."""
    p = sub.add_parser("run", help="serve durable timers from a store", description=terminal_text(__doc__),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", default=None, metavar="URL", help="sqlite:///PATH (four slashes for an absolute path) or postgresql://USER@HOST/DB "
                        f"(a password in it is masked in every log line and message); default: ${STORE_ENV}. "
                        "Without a password, PostgreSQL reads PGPASSWORD, PGPASSFILE or a service file")
    p.add_argument("--handlers", required=True, metavar="MODULE:ATTR", help="a TimerRegistry, or a callable returning one")
    p.add_argument("--partition", action="append", dest="partitions", type=_partition, metavar="NAME",
                   help="a partition to serve (repeatable); default: every partition in the store, "
                        "divided among all runners on the same PostgreSQL store")
    p.add_argument("--concurrency", type=_concurrency, default=DEFAULT_CONCURRENCY, metavar="N",
                   help="handlers running at once (an int 1..%d; default %d)" % (MAX_CONCURRENCY, DEFAULT_CONCURRENCY))
    p.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS, metavar="LEVEL",
                   help=f"log threshold on stderr, any case: {', '.join(LOG_LEVELS)} (default INFO); "
                        "DEBUG adds tracebacks of startup errors")
    p.add_argument("--metrics-port", type=_port, default=None, metavar="PORT",
                   help="serve /metrics (Prometheus) and /healthz on this port (0: any free one)")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                   help="address for --metrics-port (default 127.0.0.1, loopback only)")
    p.add_argument("--web-actions", action="store_true",
                   help="allow the status page at / to requeue, fire now, cancel, pause and resume; off loopback, "
                        "a POST needs the token in $TIMERWHEEL_C_WEB_TOKEN")
    p.add_argument("--release-claims-on-stop", action="store_true",
                   help="on SIGINT/SIGTERM make this runner's unsettled claims due at once for another runner "
                        "(a handler still running here may overlap with its retry there)")
    p.add_argument("--separate-commits", action="store_true",
                   help="PostgreSQL: commit outcomes on a connection of their own, so that claims never wait "
                        "behind a commit, even beside other runners (a runner serving the whole store alone does so "
                        "without it; one more connection; pays when the server has cores to spare)")
    p.set_defaults(func=run)


def store_url(given: Optional[str], command: str) -> str:
    """``given`` (``--store``), else ``$TIMERWHEEL_C_STORE``.

    Raises:
        ValueError: neither is set (one line naming both).
    """
    url = given if given is not None else os.environ.get(STORE_ENV)
    if not url:
        raise ValueError(f"timerwheel-c {command}: no store: pass --store URL or set {STORE_ENV}")
    return url


def _int_in(low: int, high: Optional[int], what: str):
    """An argparse type: an int in ``low..high`` (no upper bound when ``high`` is None), else an
    ArgumentTypeError naming the text and ``what`` (argparse turns it into one line, exit 2)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if n < low or (high is not None and n > high):
            raise argparse.ArgumentTypeError(f"must be {what}, got {n}")
        return n

    return parse


def _partition(text: str) -> str:
    """An argparse type: a partition name every backend stores (``check_partition``: non-empty UTF-8
    without NUL, at most 256 bytes), else an ArgumentTypeError naming it: one line, exit 2, before
    the store is opened (which creates a SQLite file)."""
    from ..storage.store import check_partition

    try:
        return check_partition(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_port = _int_in(0, 65535, "a port number 0..65535")
_concurrency = _int_in(1, MAX_CONCURRENCY, f"an int 1..{MAX_CONCURRENCY}")


def load_registry(spec: str) -> TimerRegistry:
    """Import ``module:attribute`` and return the TimerRegistry it names (calling it if callable).

    Raises:
        HandlersError: ``spec`` is not ``module:attribute``; the module cannot be imported, or
            raises (``sys.exit()`` included) while importing; the attribute is missing; calling it raises; or the
            result is no TimerRegistry. The original exception is the ``__cause__``.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise HandlersError(f"--handlers must be MODULE:ATTR, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as exc:  # any error of the user's module at import time is a bad argument
        raise HandlersError(f"--handlers {spec!r}: importing module {module_name!r} failed: "
                            f"{type(exc).__name__}: {redact(str(exc))}") from exc
    try:
        obj = getattr(module, attr)
    except AttributeError as exc:
        raise HandlersError(f"--handlers {spec!r}: module {module_name!r} has no attribute {attr!r}") from exc
    if not isinstance(obj, TimerRegistry) and callable(obj):
        try:
            obj = obj()
        except Exception as exc:
            raise HandlersError(f"--handlers {spec!r}: calling {attr!r} failed: {type(exc).__name__}: "
                                f"{redact(str(exc))}") from exc
    if not isinstance(obj, TimerRegistry):
        raise HandlersError(f"--handlers {spec!r} is a {type(obj).__name__}, not a TimerRegistry")
    return obj


def open_or_say(command: str, url: Optional[str], *, read_only: bool = False, create: bool = False):
    """The store of ``url`` (None: ``$TIMERWHEEL_C_STORE``), or None after one line on stderr
    (``timerwheel-c COMMAND: ...``, the password masked) naming why it cannot be opened: no URL,
    a bad URL, ``sqlite:///:memory:`` (a store private to this process, gone when it exits), a
    missing driver, a store error, or unless ``create`` a SQLite file that does not exist.
    ``read_only`` (commands that only read) opens it with ``open_store(url, read_only=True)``:
    no DDL, a SELECT-only role suffices, and a database without a store is refused. Without
    ``create`` (every command that is not ``run``, which serves a store and so makes one) no DDL
    runs either and such a database is refused alike ("no timerwheel_c store here"), on a session
    that may write: a typo in a URL is not a new, empty store."""
    from ..storage.errors import StoreError
    from ..storage.open import open_store, sqlite_path

    try:
        url = store_url(url, command)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return None
    try:  # before the file's existence is judged: a query in the path names no file to look for
        path = sqlite_path(url)
    except ValueError as exc:
        print(f"timerwheel-c {command}: {exc}", file=sys.stderr)
        return None
    if path == ":memory:":
        print(f"timerwheel-c {command}: {url!r} is a store private to this process, gone when it exits: "
              "name a SQLite file (sqlite:///PATH) or a PostgreSQL URL", file=sys.stderr)
        return None
    if not create and path and not os.path.exists(path):
        print(f"timerwheel-c {command}: no SQLite store at {redact(path, url)!r} (this command never creates one)",
              file=sys.stderr)
        return None
    try:
        return open_store(url, read_only=read_only, create=create)
    except (ValueError, ImportError) as exc:
        print(f"timerwheel-c {command}: {redact(str(exc), url)}", file=sys.stderr)
    except StoreError as exc:
        print(f"timerwheel-c {command}: cannot open store {redact(url)!r}: {first_line(exc, url)}", file=sys.stderr)
    return None




#: The fewest characters, spaces aside, of the token the page's actions need off loopback: any request
#: that carries it acts on the store, so it must not be guessed.
MIN_TOKEN_CHARS = 16


def actions_allowed(command: str, host: str, actions: bool) -> bool:
    """Whether the page's ``actions`` can be served on ``host``: False after one line on stderr when
    they are on, ``host`` is not loopback and ``$TIMERWHEEL_C_WEB_TOKEN`` is unset or holds fewer
    than :data:`MIN_TOKEN_CHARS` characters besides spaces (the line gives its length, never the
    token). Checked before a command opens its store."""
    from .web import TOKEN_ENV, is_loopback

    if not actions or is_loopback(host):
        return True
    token = os.environ.get(TOKEN_ENV)
    if not token:
        print(f"timerwheel-c {command}: --web-actions on {host!r} (not loopback) needs a token: set ${TOKEN_ENV}",
              file=sys.stderr)
        return False
    if len(token.strip()) < MIN_TOKEN_CHARS:
        print(f"timerwheel-c {command}: --web-actions on {host!r} (not loopback) needs a token of at least "
              f"{MIN_TOKEN_CHARS} characters besides spaces in ${TOKEN_ENV}, got {len(token.strip())}: any request "
              "that carries it acts on the store", file=sys.stderr)
        return False
    return True


def make_page(command: str, url: str, host: str, actions: bool, service=None):
    """A :class:`~.web.StatusPage` on a store of its own opened from ``url`` (``service``: the
    runner's, whose counters it charts), or None after one line on stderr saying why the store
    cannot be opened. Call :func:`actions_allowed` first."""
    from .web import TOKEN_ENV, StatusPage

    # A page without actions only reads: no DDL, so a SELECT-only role serves it, as the read-only commands.
    # With actions it writes rows, but still creates no store: it acts on timers a runner keeps.
    store = open_or_say(command, url, read_only=service is None and not actions, create=service is not None)
    if store is None:
        return None
    return StatusPage(store, url, service=service, actions=actions, host=host, token=os.environ.get(TOKEN_ENV) or None)


def _metrics_error(args, exc: Exception) -> str:
    return f"timerwheel-c run: --metrics-port {args.metrics_port} on {args.metrics_host!r}: {exc}"


def run(args) -> int:
    """Run the service until SIGINT/SIGTERM; 0 on a clean stop, 2 on a bad argument or a store
    that cannot be opened (see the module docstring)."""
    from .process import StopSignals

    try:
        args.store = store_url(args.store, "run")
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    log_to_stderr(args.log_level, args.store)
    # The handlers come before the store: opening a SQLite store creates its file.
    try:
        registry = load_registry(args.handlers)
    except HandlersError as exc:
        log.debug("loading --handlers %r failed", args.handlers, exc_info=exc.__cause__ or exc)
        print(f"timerwheel-c run: {exc}", file=sys.stderr)
        return 2
    if not registry.kinds():
        print(f"timerwheel-c run: --handlers {args.handlers!r} has no handler registered; a runner without one "
              "would hold partitions it cannot fire", file=sys.stderr)
        return 2
    if args.metrics_port is not None:
        from .exporter import check_address

        try:
            check_address(args.metrics_port, args.metrics_host)
        except (ImportError, OSError) as exc:
            print(_metrics_error(args, exc), file=sys.stderr)
            return 2
    elif args.web_actions:
        print("timerwheel-c run: --web-actions needs --metrics-port (the status page is served there)", file=sys.stderr)
        return 2
    if not actions_allowed("run", args.metrics_host, args.web_actions):
        return 2
    store = open_or_say("run", args.store, create=True)
    if store is None:
        return 2
    with StopSignals() as stop:  # from here on SIGINT/SIGTERM is a stop request, never a KeyboardInterrupt
        return _serve(args, store, registry, stop)


def _serve(args, store, registry, stop) -> int:
    """Serve until ``stop`` (a :class:`~.process.StopSignals`) receives a signal."""
    from .process import prepare_process
    from .service import DurableTimerService
    from ..timers.kind_names import KindNameMismatch

    service = DurableTimerService(store, registry, args.partitions, concurrency=args.concurrency,
                                  separate_commits=args.separate_commits)
    metrics = page = None
    if args.metrics_port is not None:
        from .exporter import serve

        page = make_page("run", args.store, args.metrics_host, args.web_actions, service=service)
        if page is None:  # its store would not open (one line said why)
            store.close()
            return 2
        try:
            metrics = serve(service, args.metrics_port, args.metrics_host, page=page)
        except (ImportError, OSError) as exc:  # taken since it was checked
            page.close()
            store.close()
            print(_metrics_error(args, exc), file=sys.stderr)
            return 2
        log.info("serving /metrics and /healthz on http://%s:%d", metrics.host, metrics.port)
        log.info("serving the status page on http://%s:%d/ (actions %s)", metrics.host, metrics.port,
                 "on" if args.web_actions else "off")
    prepare_process()  # this process exists to run the service: see .process
    try:
        received = _start(service, stop)
    except KindNameMismatch as exc:  # its handlers are another application's: one line, as a bad argument
        service.stop(timeout=0)
        if metrics is not None:
            metrics.close()
        store.close()
        print(f"timerwheel-c run: {exc}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as exc:  # threads or memory for --concurrency the system will not give
        service.stop(timeout=0)
        if metrics is not None:
            metrics.close()
        if page is not None:
            page.close()
        store.close()
        print(f"timerwheel-c run: cannot start {args.concurrency} handler slot(s) (--concurrency): {exc}",
              file=sys.stderr)
        return 2
    status = 0
    try:
        if received is not None:
            log.info("received %s while starting; stopping", received.name)
        else:
            which = ("a fleet share of the store's shards" if service.ownership is not None
                     else args.partitions or "all partitions")
            log.info("serving %s: %s, with kinds %s, %d handler(s) at once", redact(args.store), which,
                     registry.kinds(), args.concurrency)
            # The wait ends at once on a signal; its timeout is how often the thread's life is checked.
            while (received := stop.wait(0.2)) is None:
                if not service.running:
                    why = service.died
                    log.critical("the durable timer thread ended without a stop: %s; exiting with status 1",
                                 "unknown cause" if why is None else f"{type(why).__name__}: {printable(str(why))}")
                    status = 1
                    return status
            log.info("received %s; stopping", received.name)
    finally:
        _stop(args, service, metrics, page, store, status)
    log.info("stopped")
    return 0


def _start(service, stop):
    """``service.start()`` on a thread of its own while this thread waits for a signal too: start()
    waits for the store (the change signal's first statement), which may not answer, and a signal
    meanwhile must still stop the process. Returns the signal received first (a
    :class:`signal.Signals`), or None once the service started.

    Raises:
        MemoryError / RuntimeError: what ``service.start()`` raised.
    """
    started: concurrent.futures.Future = concurrent.futures.Future()

    def start() -> None:
        try:
            service.start()
        except BaseException as exc:
            started.set_exception(exc)
        else:
            started.set_result(None)

    threading.Thread(target=start, name="durable-start", daemon=True).start()
    while not started.done():
        received = stop.wait(_START_POLL_S)
        if received is not None:
            return received
    started.result()
    return None


def _stop(args, service, metrics, page, store, status: int) -> None:
    """Stop the service and close the metrics server, its status page and the store; ends the process with ``status``
    if that takes past :data:`STOP_S` + :data:`EXIT_GRACE_S` seconds (see :class:`~.process.StopDeadline`)."""
    from .process import StopDeadline

    deadline = StopDeadline(STOP_S + EXIT_GRACE_S, status)
    deadline.step = "stopping the service"
    service.stop(timeout=STOP_S, release_claims=args.release_claims_on_stop)
    if metrics is not None:
        deadline.step = "closing the metrics server"
        metrics.close()
    if page is not None:
        deadline.step = "closing the status page's store"
        page.close()
    deadline.step = "closing the store: a statement the server has not answered holds its connection"
    store.close()
    deadline.cancel()
