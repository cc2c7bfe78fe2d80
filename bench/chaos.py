"""Chaos on a PostgreSQL fleet: ``python bench/run.py -m bench.chaos --pg-dsn postgresql://... [--pg-data DIR]``.

Three ``timerwheel-c run`` processes serve the partitions of a fresh schema as a fleet, one of them
with its host clock skewed by libfaketime (``--skew-s``, +5 s by default) when libfaketime is
installed. A writer schedules timers by name, due 1 to 4 s ahead by the server's clock, and
reschedules and cancels some of them. Meanwhile, one after the other, spread over ``--duration-s``:

- ``sigkill``: a runner is SIGKILLed, then started again;
- ``sigstop``: a runner is frozen with SIGSTOP for ``--freeze-s`` (its connections stay open), then
  woken with SIGCONT;
- ``drop``: iptables drops every packet of a runner's open connections to the server, in this host's
  OUTPUT chain, for ``--hold-s`` (only as root, where iptables works; a connection the runner opens
  meanwhile is not dropped);
- ``pg-restart``: ``pg_ctl restart -m fast`` of the server (only with ``--pg-data``, the server's
  data directory on this host);
- ``read-only``: ``ALTER SYSTEM SET default_transaction_read_only = on`` and a reload, for
  ``--hold-s``, then off again (only as a superuser).

Each fire is recorded by the handler in the same transaction as the fire itself (an effect row
beside the timer's, committed with its removal), holding the server's ``clock_timestamp()`` read by
the handler (so a fire is judged by the server's clock, after the handler was called: a fire earlier
than its due time by less than one round trip cannot be seen), the runner's pid and the attempt.
After the writer stops, the run waits up to ``--grace-s`` for every due timer to fire, then counts:

- ``lost``: scheduled, never cancelled, due before the writer stopped, and never fired;
- ``doubled``: fired (committed) more than once;
- ``early``: fired before its due time (the last one a successful schedule or reschedule gave it);
- ``after cancel``: fired although a cancel returned True for it.

A write that raised (the server restarting or refusing writes) has an unknown outcome: its timer is
left out of those counts, and the count of such writes is printed. The table gives each fault with
its time and, for each, the worst lateness of the timers due from its start until the next fault's.
The exit status is 1 if any count but the faults is non-zero, 0 otherwise; 2 on a bad argument.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional
from urllib.parse import quote

from timerwheel_c.durable.storage.shards import shard_of
from timerwheel_c.durable.storage.store import Batch
from timerwheel_c.durable.timers.keys import TimerKind
from timerwheel_c.durable.timers.registry import Done, TimerHandler, TimerRegistry
from .run import command
from .stores import add_pg_dsn, pg_dsn

__all__ = ["Chaos", "main", "registry"]

KIND = TimerKind(0xC4)
# The store is made with one shard per partition, and the partitions are named so that each lies in a
# shard of its own: the fleet divides shards, so every runner then serves some of the partitions (with
# 12 partitions over 64 shards, one runner could own none of theirs, and never be divided in).
SHARDS = 12
PARTITIONS = list({shard_of(name, SHARDS): name for name in (f"chaos{i:03d}" for i in range(999, -1, -1))}.values())
FIRED = b"chaos-fired/"  # effect rows, outside the timer rows' key space
_SCHEMA_DSN_ENV = "TIMERWHEEL_C_CHAOS_DSN"  # the runner's DSN, kept off its command line (ps shows that)
_START_S = 90.0  # bound on the runners starting and dividing the partitions, on a loaded machine
_FAKETIME_LIBS = "/usr/lib/*/faketime/libfaketime.so.1"
FAULTS = ("sigkill", "sigstop", "drop", "pg-restart", "read-only")


class _ServerClock(threading.local):
    """A store of its own per handler thread (the runner's store's sibling), read for the server's clock,
    so that the reads never queue behind the runner's own statements."""

    store = None

    def now_us(self, runner_store) -> int:
        if self.store is None:
            self.store = runner_store.open_sibling()
        return self.store.clock_ns() // 1000


_clock = _ServerClock()


class Record(TimerHandler):
    """Done with one effect row per fire, ``chaos-fired/<reference>/<token>`` holding ``"<server µs>
    <pid> <attempt>"``: a fire committed twice shows as two rows. A failed clock read raises, and the
    runner retries the timer after its backoff."""

    kind = KIND

    def fire(self, ctx, timer):
        at_us = _clock.now_us(ctx.store)
        row = FIRED + timer.reference + b"/" + os.urandom(8).hex().encode()
        return Done(Batch().put(row, b"%d %d %d" % (at_us, os.getpid(), timer.attempt)))


registry = TimerRegistry().register(Record())


def _runner() -> int:
    """Process entry: ``timerwheel-c run`` with :data:`registry`, the store from the environment."""
    from timerwheel_c.cli import main as cli_main

    os.environ["TIMERWHEEL_C_STORE"] = os.environ[_SCHEMA_DSN_ENV]
    # 4 handler threads, not the default 16: each holds a connection for its clock reads.
    return cli_main(["run", "--handlers", "bench.chaos:registry", "--concurrency", "4"])


def faketime_lib() -> Optional[str]:
    """libfaketime's preload library on this host, or None."""
    found = sorted(glob.glob(_FAKETIME_LIBS))
    return found[0] if found else None


def iptables_usable() -> Optional[str]:
    """None where this process may add iptables rules, else why not (one line)."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("iptables") is None:
        return "no iptables command"
    probe = subprocess.run(["iptables", "-w", "-L", "OUTPUT", "-n"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"iptables -L fails: {probe.stderr.strip()[:120]}"


def _pg_ctl(data: str) -> Optional[str]:
    """The pg_ctl of the server version whose data directory is ``data`` (its PG_VERSION), else PGBIN's
    or the one on PATH; None when none is found."""
    with contextlib.suppress(OSError):
        version = (Path(data) / "PG_VERSION").read_text().strip()
        candidate = f"/usr/lib/postgresql/{version}/bin/pg_ctl"
        if os.access(candidate, os.X_OK):
            return candidate
    candidates = [os.path.join(os.environ.get("PGBIN", "/usr/lib/postgresql/15/bin"), "pg_ctl"), shutil.which("pg_ctl")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def _tcp_ports(pid: int, server_port: int) -> list:
    """The local ports of ``pid``'s TCP connections to ``server_port`` (read from /proc)."""
    inodes = set()
    for fd in glob.glob(f"/proc/{pid}/fd/*"):
        with contextlib.suppress(OSError):
            link = os.readlink(fd)
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in list(f)[1:]:
                cols = line.split()
                local, remote, inode = cols[1], cols[2], cols[9]
                if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == server_port:
                    ports.append(int(local.rsplit(":", 1)[1], 16))
    return ports


@dataclass
class Name:
    """What the writer knows of one timer name: its due time by the last successful write (ms by the
    server's clock), whether a cancel returned True, and whether a write of it raised."""

    partition: str
    due_ms: int
    cancelled: bool = False
    unsure: bool = False
    fires: list = field(default_factory=list)  # (server ms, pid, attempt) of each committed fire


class Chaos:
    """One chaos run on the server of ``dsn`` (see the module docstring); :meth:`run` returns the report."""

    def __init__(self, dsn: str, *, duration_s: float, grace_s: float, hold_s: float, freeze_s: float,
                 skew_s: float, pg_data: Optional[str], faults: tuple, seed: int, say=print):
        self.dsn, self.duration_s, self.grace_s, self.hold_s, self.freeze_s = dsn, duration_s, grace_s, hold_s, freeze_s
        self.skew_s, self.pg_data, self.say = skew_s, pg_data, say
        self.rng = random.Random(seed)
        self.schema = f"chaos_{uuid.uuid4().hex[:12]}"
        sep = "&" if "?" in dsn else "?"
        self.url = f"{dsn}{sep}options={quote(f'-csearch_path={self.schema}')}"
        self.names: dict = {}
        self.unsure_writes = 0
        self.rescheduled = 0  # reschedules that moved a pending timer
        self.events: list = []  # (server ms, fault, detail)
        self.skipped: list = []  # one line per fault or condition left out
        self.procs: list = [None, None, None]
        self.faults = self._usable(faults)
        self._offset_ms = 0  # server clock minus this host's, ms
        self._start_ms = 0  # the writer's start, ms by the server's clock
        self.logs = Path()  # the runners' stderr, a directory of the run's own (kept when the start fails)

    # -- set-up ---------------------------------------------------------------------------------------

    def _usable(self, wanted: tuple) -> list:
        usable = []
        for fault in wanted:
            why = None
            if fault == "drop":
                why = iptables_usable()
            elif fault == "pg-restart":
                why = ("no --pg-data (the server's data directory on this host)" if self.pg_data is None
                       else None if _pg_ctl(self.pg_data) else "no pg_ctl found (set PGBIN)")
            if why is None:
                usable.append(fault)
            else:
                self.skipped.append(f"{fault}: skipped, {why}")
        if faketime_lib() is None:
            self.skipped.append("skewed clock: skipped, libfaketime is not installed (apt-get install faketime)")
        return usable

    def _server_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self._offset_ms

    def _control(self):
        """A new superuser session on the server, out of any read-only default (autocommit)."""
        import psycopg

        conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10)
        conn.execute("SET default_transaction_read_only = off")
        return conn

    def _start_runner(self, i: int) -> None:
        env = dict(os.environ, **{_SCHEMA_DSN_ENV: self.url})
        lib = faketime_lib()
        if i == 2 and lib is not None:
            env.update(LD_PRELOAD=lib, FAKETIME=f"{self.skew_s:+g}s")
        # cwd=/: the runner must import the installed timerwheel_c, never a checkout in the working directory.
        with open(self.logs / f"runner{i}.log", "a") as log:
            self.procs[i] = subprocess.Popen(command("bench.chaos", "runner"), env=env, cwd="/",
                                             stdout=subprocess.DEVNULL, stderr=log)

    def _wait_divided(self, store) -> None:
        from timerwheel_c.durable.storage.postgres.ownership import holders

        deadline = time.monotonic() + _START_S
        while True:
            held = holders(store, None, kinds=[int(KIND)])
            if len(held) == len(PARTITIONS) and len(set(held.values())) == len(self.procs):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"chaos: the {len(self.procs)} runners did not divide the partitions "
                                   f"within {_START_S:g} s; their logs: {self.logs}")
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"chaos: a runner exited with status {p.returncode} while starting; "
                                       f"its log: {self.logs}")
            time.sleep(0.2)

    # -- the writer -----------------------------------------------------------------------------------

    def _write(self, store, stop: threading.Event) -> None:
        from timerwheel_c.durable import cancel, reschedule, schedule

        serial = 0
        pending: list = []
        while not stop.is_set():
            now = self._server_ms()
            pending = [n for n in pending if not self.names[n].cancelled and self.names[n].due_ms > now - 500]
            roll = self.rng.random()
            due_ms = now + self.rng.randint(1000, 4000)
            what = "schedule" if roll < 0.6 or not pending else "reschedule" if roll < 0.8 else "cancel"
            if what == "schedule":
                ref = b"n%06d" % serial
                serial += 1
                entry = self.names[ref] = Name(PARTITIONS[serial % len(PARTITIONS)], due_ms)
                pending.append(ref)
            else:
                ref = self.rng.choice(pending)
                entry = self.names[ref]
            try:
                if what == "schedule":
                    schedule(store, entry.partition, due_ms, KIND, ref)
                elif what == "reschedule" and reschedule(store, entry.partition, due_ms, KIND, ref):
                    entry.due_ms = due_ms
                    self.rescheduled += 1
                elif what == "cancel" and cancel(store, entry.partition, KIND, ref):
                    entry.cancelled = True
            except Exception:  # noqa: BLE001 - the outcome is unknown: this name is not judged
                entry.unsure = True
                self.unsure_writes += 1
                stop.wait(0.2)
                continue
            stop.wait(0.05)

    # -- faults ---------------------------------------------------------------------------------------

    def _event(self, fault: str, detail: str) -> None:
        self.events.append((self._server_ms(), fault, detail))
        self.say(f"chaos: {fault}: {detail}")

    def _inject(self, fault: str) -> None:
        if fault == "sigkill":
            victim = self.procs[0]
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            self._event(fault, f"runner 0 (pid {victim.pid}) killed and started again")
            self._start_runner(0)
        elif fault == "sigstop":
            victim = self.procs[1]
            victim.send_signal(signal.SIGSTOP)
            self._event(fault, f"runner 1 (pid {victim.pid}) frozen for {self.freeze_s:g} s")
            try:
                time.sleep(self.freeze_s)
            finally:
                victim.send_signal(signal.SIGCONT)
        elif fault == "drop":
            self._drop(self.procs[2])
        elif fault == "pg-restart":
            self._restart_server()
        elif fault == "read-only":
            with self._control() as conn:
                conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
                conn.execute("SELECT pg_reload_conf()")
            self._event(fault, f"default_transaction_read_only on for {self.hold_s:g} s")
            try:
                time.sleep(self.hold_s)
            finally:
                self._read_write()

    def _read_write(self) -> None:
        """Writes allowed again (also on the way out of a run that failed mid-fault)."""
        with self._control() as conn:
            conn.execute("ALTER SYSTEM RESET default_transaction_read_only")
            conn.execute("SELECT pg_reload_conf()")

    def _drop(self, victim) -> None:
        from psycopg.conninfo import conninfo_to_dict

        server_port = int(conninfo_to_dict(self.dsn).get("port") or 5432)
        ports = _tcp_ports(victim.pid, server_port)
        rules = [r for p in ports for r in (["-p", "tcp", "--sport", str(p), "--dport", str(server_port), "-j", "DROP"],
                                            ["-p", "tcp", "--sport", str(server_port), "--dport", str(p), "-j", "DROP"])]
        for rule in rules:
            subprocess.run(["iptables", "-w", "-I", "OUTPUT", *rule], check=True)
        self._event("drop", f"packets of runner 2's {len(ports)} connections dropped for {self.hold_s:g} s")
        try:
            time.sleep(self.hold_s)
        finally:
            for rule in rules:
                subprocess.run(["iptables", "-w", "-D", "OUTPUT", *rule], check=False)

    def _restart_server(self) -> None:
        assert self.pg_data is not None
        data = Path(self.pg_data)
        as_owner: list = []
        owner = data.stat().st_uid
        if os.geteuid() == 0 and owner != 0:
            import pwd

            as_owner = ["runuser", "-u", pwd.getpwuid(owner).pw_name, "--"]
        self._event("pg-restart", "pg_ctl restart -m fast")
        subprocess.run([*as_owner, str(_pg_ctl(self.pg_data)), "-D", str(data), "-m", "fast", "-w", "restart"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    # -- the run --------------------------------------------------------------------------------------

    def run(self) -> dict:
        """Run the fleet, the writer and the faults; returns the report (:meth:`report`).

        Raises:
            RuntimeError: the runners did not start and divide the partitions within 90 s.
            psycopg.Error: the server cannot be reached at the start.
        """
        from timerwheel_c.durable import schedule
        from timerwheel_c.durable.storage.postgres import PostgresStore

        self.logs = Path(tempfile.mkdtemp(prefix="timerwheel-c-chaos-"))
        with self._control() as conn:
            conn.execute(f"CREATE SCHEMA {self.schema}")
            if "read-only" in self.faults and conn.execute("SHOW is_superuser").fetchone() != ("on",):
                self.faults.remove("read-only")
                self.skipped.append("read-only: skipped, ALTER SYSTEM needs a superuser")
        store = PostgresStore(self.url, shard_count=SHARDS)
        stop = threading.Event()
        writer = threading.Thread(target=self._write, args=(store, stop), name="chaos-writer", daemon=True)
        try:
            self._offset_ms = store.clock_ns() // 1_000_000 - time.time_ns() // 1_000_000
            for p in PARTITIONS:  # the partitions exist before the runners start, so they divide them at once
                schedule(store, p, self._server_ms() + 86_400_000, KIND, b"anchor")
            for i in range(len(self.procs)):
                self._start_runner(i)
            self._wait_divided(store)
            if faketime_lib() is not None:
                self.say(f"chaos: runner 2's host clock runs {self.skew_s:+g} s off (libfaketime) for the whole run")
            self.say(f"chaos: 3 runners serve {len(PARTITIONS)} partitions; writing for {self.duration_s:g} s")
            started = time.monotonic()
            self._start_ms = self._server_ms()
            writer.start()
            gap_s = self.duration_s / (len(self.faults) + 1)
            for k, fault in enumerate(self.faults):
                time.sleep(max(0.0, started + gap_s * (k + 1) - time.monotonic()))
                self._inject(fault)
            time.sleep(max(0.0, started + self.duration_s - time.monotonic()))
            stop.set()
            writer.join()
            end_ms = self._server_ms()
            self._wait_fired(store, end_ms)
            report = self.report(end_ms)
            shutil.rmtree(self.logs, ignore_errors=True)
            return report
        finally:
            stop.set()
            for p in self.procs:
                if p is not None and p.poll() is None:
                    p.send_signal(signal.SIGCONT)
            if "read-only" in self.faults:
                with contextlib.suppress(Exception):
                    self._read_write()
            from .procs import stop as procs_stop

            procs_stop([p for p in self.procs if p is not None])
            store.close()
            with contextlib.suppress(Exception), self._control() as conn:
                conn.execute(f"DROP SCHEMA {self.schema} CASCADE")

    def _expected(self, end_ms: int) -> list:
        return [n for n in self.names.values() if not n.unsure and not n.cancelled and n.due_ms <= end_ms]

    def _collect(self, store) -> None:
        for n in self.names.values():
            n.fires = []
        for p in PARTITIONS:
            for key, value in store.scan(p, FIRED, FIRED[:-1] + b"0", limit=1_000_000).entries:
                ref = key[len(FIRED):].split(b"/")[0]
                at_us, pid, attempt = (int(v) for v in value.split())
                if ref in self.names:
                    self.names[ref].fires.append((at_us // 1000, pid, attempt))

    def _wait_fired(self, store, end_ms: int) -> None:
        deadline = time.monotonic() + self.grace_s
        while True:
            self._collect(store)
            if all(n.fires for n in self._expected(end_ms)) or time.monotonic() > deadline:
                return
            time.sleep(1.0)

    def report(self, end_ms: int) -> dict:
        """``{"faults": [{"at_s", "fault", "detail", "worst_lateness_ms"}], "skipped": [str], "timers": int,
        "skew_s": float or None, "fired": int, "cancelled": int, "rescheduled": int, "unsure_writes": int,
        "lost": int, "doubled": int, "early": int, "after_cancel": int}``. ``at_s``: seconds from the
        writer's start; ``worst_lateness_ms``: of the timers due from that fault until the next, by the
        server's clock (None: none was due); ``skew_s``: runner 2's clock offset in s (None without
        libfaketime)."""
        judged = [n for n in self.names.values() if not n.unsure]
        counts = {
            "lost": sum(1 for n in self._expected(end_ms) if not n.fires),
            "doubled": sum(1 for n in judged if len(n.fires) > 1),
            "early": sum(1 for n in judged if any(at < n.due_ms for at, _, _ in n.fires)),
            "after_cancel": sum(1 for n in judged if n.cancelled and n.fires),
        }
        first_ms = self._start_ms
        marks = [(first_ms, "none", "before the first fault")] + self.events
        faults = []
        for k, (at_ms, fault, detail) in enumerate(marks):
            until_ms = marks[k + 1][0] if k + 1 < len(marks) else end_ms
            late = [at - n.due_ms for n in judged if at_ms <= n.due_ms < until_ms and not n.cancelled
                    for at, _, _ in n.fires[:1]]
            faults.append({"at_s": round((at_ms - first_ms) / 1000, 1), "fault": fault, "detail": detail,
                           "worst_lateness_ms": max(late) if late else None})
        return {"faults": faults, "skipped": self.skipped, "timers": len(self.names),
                "skew_s": self.skew_s if faketime_lib() is not None else None,
                "fired": sum(1 for n in judged if n.fires), "cancelled": sum(1 for n in judged if n.cancelled),
                "rescheduled": self.rescheduled, "unsure_writes": self.unsure_writes, **counts}


def print_report(report: dict, say=print) -> None:
    """The report as a table of faults and one of counts (every count must be 0)."""
    say("")
    say(f"{'at (s)':>7}  {'fault':<11} {'worst lateness (ms)':>19}  detail")
    for f in report["faults"]:
        late = "-" if f["worst_lateness_ms"] is None else f"{f['worst_lateness_ms']:,}"
        say(f"{f['at_s']:>7}  {f['fault']:<11} {late:>19}  {f['detail']}")
    if report["skew_s"] is not None:
        say(f"         skewed clock: runner 2's host clock ran {report['skew_s']:+g} s off throughout (libfaketime)")
    for line in report["skipped"]:
        say(f"         {line}")
    say("")
    say(f"faults injected: {len(report['faults']) - 1}; timers named: {report['timers']:,}, fired: "
        f"{report['fired']:,}, cancelled: {report['cancelled']:,}, rescheduled: {report['rescheduled']:,}; "
        f"writes with an unknown outcome (not judged): {report['unsure_writes']:,}")
    for key, what in (("lost", "lost"), ("doubled", "doubled"), ("early", "fired early"),
                      ("after_cancel", "fired after a successful cancel")):
        say(f"  {what:<34} {report[key]:>6}  {'ok' if report[key] == 0 else 'FAILED'}")


def main(argv: list) -> int:
    """``python bench/run.py -m bench.chaos --pg-dsn DSN ...`` (``--help``); returns the exit status."""
    parser = argparse.ArgumentParser(prog="bench.chaos", description=__doc__.split("\n\n")[0])
    add_pg_dsn(parser)
    parser.add_argument("--pg-data", default=None, metavar="DIR",
                        help="the server's data directory on this host, to restart it with pg_ctl (else skipped)")
    parser.add_argument("--duration-s", type=float, default=180.0, help="how long the writer runs (default 180)")
    parser.add_argument("--grace-s", type=float, default=60.0,
                        help="how long to wait after the writer for due timers to fire (default 60)")
    parser.add_argument("--hold-s", type=float, default=10.0, help="length of the drop and read-only faults (default 10)")
    parser.add_argument("--freeze-s", type=float, default=30.0,
                        help="length of the SIGSTOP (default 30: past the fleet's 20 s lease, so it is taken over)")
    parser.add_argument("--skew-s", type=float, default=5.0, help="the skewed runner's clock offset (default +5)")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, from {','.join(FAULTS)}")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    args = parser.parse_args(argv)
    dsn = pg_dsn(args.pg_dsn)
    faults = tuple(f for f in args.faults.split(",") if f)
    bad = [f for f in faults if f not in FAULTS]
    if dsn is None or bad or args.duration_s < 10 or min(args.grace_s, args.hold_s, args.freeze_s) <= 0:
        parser.print_usage(sys.stderr)
        print("bench.chaos: error: " + (f"unknown fault(s) {bad}" if bad else "--pg-dsn is required" if dsn is None
              else f"--duration-s must be >= 10 and the other lengths > 0, got {args.duration_s!r}, "
                   f"{args.grace_s!r}, {args.hold_s!r}, {args.freeze_s!r}"), file=sys.stderr)
        return 2
    chaos = Chaos(dsn, duration_s=args.duration_s, grace_s=args.grace_s, hold_s=args.hold_s, freeze_s=args.freeze_s,
                  skew_s=args.skew_s, pg_data=args.pg_data, faults=faults, seed=args.seed,
                  say=lambda line: print(line, flush=True))
    report = chaos.run()
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 1 if any(report[k] for k in ("lost", "doubled", "early", "after_cancel")) else 0


if __name__ == "__main__":
    sys.exit(_runner() if sys.argv[1:] == ["runner"] else main(sys.argv[1:]))
