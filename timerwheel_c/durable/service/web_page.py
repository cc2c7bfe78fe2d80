"""The HTML of the status page (:mod:`~timerwheel_c.durable.service.web`): plain HTML, inline CSS,
inline SVG charts and one inline script that reloads the live sections every :data:`REFRESH_S`
seconds. Everything from the store goes through :func:`esc`: HTML-escaped, and control
characters shown as their escapes (``\\n``, ``\\x1b``), as the operator commands print them.
"""
from __future__ import annotations

import base64
import datetime as dt
import hashlib
import html
from typing import Optional
from urllib.parse import urlencode

from ..storage.runner_name import parse_runner_name
from ..timers.triggers import Cron
from ..timers.writer import STATES
from .cli_text import in_words, local_iso, printable
from .fleet import kinds_text, owned_text

__all__ = ["HISTORY_S", "REFRESH_S", "SCRIPT_SHA256", "esc", "message_page", "render"]

REFRESH_S = 5  # the live sections reload this often (s)
HISTORY_S = 600.0  # the chart spans this much (s)

# Replaces each [data-live] section by its fresh copy from the same URL; the copy comes from the
# server, which escaped it, and DOMParser runs no script of it.
SCRIPT = """(function () {
  function refresh() {
    if (document.hidden) { return; }
    fetch(location.href, {credentials: "same-origin"}).then(function (r) {
      return r.ok ? r.text() : null;
    }).then(function (text) {
      if (text === null) { return; }
      var fresh = new DOMParser().parseFromString(text, "text/html");
      document.querySelectorAll("[data-live]").forEach(function (el) {
        var copy = fresh.getElementById(el.id);
        if (copy) { el.replaceWith(document.importNode(copy, true)); }
      });
    }).catch(function () {});
  }
  setInterval(refresh, %d);
})();""" % (REFRESH_S * 1000)
#: The Content-Security-Policy hash that lets :data:`SCRIPT`, and no other script, run.
SCRIPT_SHA256 = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()

STYLE = """
:root { --fg: #1d2433; --muted: #5c6578; --line: #e3e6ee; --bg: #f6f7fb; --card: #fff; --accent: #2f6fdf;
        --bad: #c62f3a; --warn: #b86e00; --ok: #2a8a4a; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       background: var(--bg); }
header { background: #1d2433; color: #fff; padding: 14px 28px; display: flex; align-items: baseline; gap: 18px; }
header h1 { font-size: 18px; margin: 0; font-weight: 600; }
header .meta { color: #b9c1d4; font-size: 13px; }
main { padding: 18px 28px 40px; max-width: 1400px; }
h2 { font-size: 15px; margin: 26px 0 8px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 16px; min-width: 150px; }
.card .n { font-size: 24px; font-weight: 600; }
.card .l { color: var(--muted); font-size: 12px; }
.card.bad .n { color: var(--bad); }
table { border-collapse: collapse; width: 100%; background: var(--card); border: 1px solid var(--line);
        border-radius: 8px; overflow: hidden; }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: #eef0f6; font-weight: 600; font-size: 12px; color: var(--muted); }
tr:last-child td { border-bottom: none; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.ref, td.err { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px;
                 max-width: 420px; overflow-wrap: anywhere; }
.muted { color: var(--muted); }
.late { color: var(--bad); }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; background: #e7eaf2; }
.badge.parked { background: #fbe3e5; color: var(--bad); }
.badge.retrying { background: #fdf0d9; color: var(--warn); }
.badge.paused { background: #fdf0d9; color: var(--warn); }
.badge.live { background: #ddf2e4; color: var(--ok); }
.note, .error { padding: 8px 12px; border-radius: 6px; margin: 12px 0; }
.note { background: #ddf2e4; }
.error { background: #fbe3e5; color: var(--bad); }
form.search { display: flex; flex-wrap: wrap; gap: 8px; align-items: end; margin-bottom: 10px; }
form.search label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); }
input, select, button { font: inherit; padding: 4px 8px; border: 1px solid #c6cbd8; border-radius: 5px; background: #fff; }
button { cursor: pointer; }
button.primary { background: var(--accent); color: #fff; border-color: var(--accent); }
td.actions button { padding: 1px 8px; font-size: 12px; margin-right: 4px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
.chart { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 8px 12px; }
.chart .t { font-size: 12px; color: var(--muted); }
"""


def esc(value) -> str:
    """``value`` as text fit for HTML: control characters as their escapes, then HTML-escaped
    (quotes too, so it is safe in an attribute)."""
    return html.escape(printable(str(value)), quote=True)


def _field(value) -> str:
    """``value`` for a form field's ``value`` attribute, HTML-escaped only: sent back as typed, so that
    a search submitted again finds what it found (esc() would send a tab back as a backslash and t)."""
    return html.escape(str(value), quote=True)


def _when(ms: Optional[int], now_ms: int, *, due: bool = True) -> str:
    """A time and how far it is from now; a ``due`` time past by a second is marked late."""
    if ms is None:
        return '<span class="muted">-</span>'
    late = ' class="late"' if due and ms < now_ms - 1000 else ' class="muted"'
    return f'{esc(local_iso(ms))} <span{late}>({esc(in_words(ms, now_ms))})</span>'


def _reference(reference: bytes) -> str:
    """UTF-8 text as text (its control characters escaped by :func:`esc`), anything else as hex."""
    try:
        return esc(reference.decode("utf-8"))
    except UnicodeDecodeError:
        return f'<span class="muted">hex:</span>{esc(reference.hex())}'


def _table(headings: list, rows: list, empty: str) -> str:
    if not rows:
        return f'<p class="muted">{esc(empty)}</p>'
    head = "".join(f"<th>{esc(h)}</th>" for h in headings)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _button(action: str, kind: int, target: bytes, partition: str) -> str:
    # The partition in hex, as the target: esc() shows a tab as "\\t", and a browser turns a CR in
    # an attribute into LF, so a name sent as text could come back as another partition's.
    value = f"{action} {kind} {target.hex()} {partition.encode('utf-8', 'surrogateescape').hex()}"
    return f'<button type="submit" form="act" name="act" value="{esc(value)}">{esc(action)}</button>'


def _runner_who(runner: dict) -> tuple:
    """``(host, OS pid)`` from the name a runner gives its connection; ``("-", "-")`` when hidden."""
    who = parse_runner_name(runner.get("name"))
    return (who[0], str(who[1])) if who else ("-", "-")


def _fleet(fleet: dict, now_ms: int) -> str:
    if fleet["runners"] is None:
        return '<p class="muted">A SQLite store records no runners: only the partitions below are known.</p>'
    rows = []
    for r in fleet["runners"]:
        host, pid = _runner_who(r)
        beat = r.get("heartbeat_ms")
        beat_text = "-" if beat is None else f"{beat / 1000:.1f} s ago"
        rows.append(f"<tr><td>{esc(host)}</td><td class=num>{esc(pid)}</td><td class=num>{esc(r['backend_pid'])}</td>"
                    f"<td>{_when(r['since_ms'], now_ms, due=False)}</td><td>{esc(kinds_text(r['kinds']))}</td>"
                    f"<td>{esc(owned_text(r))}</td><td class=num>{esc(beat_text)}</td></tr>")
    return _table(["host", "pid", "backend pid", "since", "kinds", "partitions", "heartbeat"], rows,
                  "No live runner holds this store's partitions.")


def _count(n: int, capped: bool) -> str:
    return f"{n}+" if capped else str(n)


def _partitions(fleet: dict, now_ms: int) -> str:
    who = {r["backend_pid"]: "%s pid %s" % _runner_who(r) for r in fleet["runners"] or ()}
    rows = []
    for p in fleet["partitions"]:
        if p["owners"] is None:
            owner = '<span class="muted">not recorded</span>'
        else:
            owner = esc(", ".join(who.get(o, str(o)) for o in p["owners"]) or "-")
        parked = _count(p["parked"], p["parked_capped"])
        if p["parked"]:
            link = "/?" + urlencode({"partition": p["partition"], "state": "parked"})
            parked = f'<a href="{esc(link)}">{esc(parked)}</a>'
        rows.append(f"<tr><td>{esc(p['partition'])}</td><td>{owner}</td>"
                    f"<td class=num>{esc(_count(p['due_backlog'], p['due_backlog_capped']))}</td>"
                    f"<td>{_when(p['oldest_due_at_ms'], now_ms)}</td><td class=num>{parked}</td></tr>")
    shown, total = len(fleet["partitions"]), fleet["partitions_total"]
    more = (f'<p class="muted">The first {shown:,} of {total:,} partitions, in name order: search below for any '
            'other.</p>' if total > shown else "")
    return _table(["partition", "owner", "due backlog", "oldest due", "parked"], rows,
                  "No partition holds a row yet.") + more


def _polyline(points: list, x_of, y_of, color: str) -> str:
    """A line through ``points`` with a dot on each, so that a single interval shows too."""
    xy = [(x_of(x), y_of(y)) for x, y in points if y is not None]
    if not xy:
        return ""
    coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.2" fill="{color}"/>' for x, y in xy)
    return f'<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{coords}"/>{dots}'


def _figure(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _chart(title: str, series: list, unit: str) -> str:
    """An SVG line chart of ``series`` (``(label, color, [(seconds ago, value)])``) over :data:`HISTORY_S`."""
    w, h, left, bottom = 520, 150, 46, 20
    top_value = max([v for _, _, pts in series for _, v in pts if v is not None] + [0.0]) * 1.15 or 1.0

    def x_of(ago_s: float) -> float:
        return left + (w - left - 8) * (1 - min(ago_s, HISTORY_S) / HISTORY_S)

    def y_of(value: float) -> float:
        return 8 + (h - bottom - 8) * (1 - value / top_value)

    lines = "".join(_polyline(pts, x_of, y_of, color) for _, color, pts in series)
    legend = " ".join(f'<tspan fill="{color}">&#9632; {esc(label)}</tspan>' for label, color, _ in series)
    grid = "".join(f'<line x1="{left}" x2="{w - 8}" y1="{y_of(top_value * f):.1f}" y2="{y_of(top_value * f):.1f}" '
                   f'stroke="#e3e6ee"/><text x="{left - 4}" y="{y_of(top_value * f) + 4:.1f}" text-anchor="end" '
                   f'font-size="10" fill="#5c6578">{_figure(top_value * f)}</text>' for f in (0, 0.5, 1))
    return (f'<div class="chart"><div class="t">{esc(title)} ({esc(unit)})</div>'
            f'<svg width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{esc(title)}">{grid}{lines}'
            f'<text x="{left}" y="{h - 4}" font-size="10" fill="#5c6578">{int(HISTORY_S // 60)} min ago</text>'
            f'<text x="{w - 8}" y="{h - 4}" font-size="10" fill="#5c6578" text-anchor="end">now</text>'
            f'<text x="{w // 2}" y="{h - 4}" font-size="11" text-anchor="middle">{legend}</text></svg></div>')


def _rates(history: Optional[list]) -> str:
    if history is None:
        return ('<p class="muted">Fired/s and lateness come from a runner\'s own counters: open the page that '
                '<code>timerwheel-c run --metrics-port</code> serves to see them.</p>')
    if not history:
        return '<p class="muted">The first figures appear a few seconds after the runner starts.</p>'
    fired = [(ago, rate) for ago, rate, _, _ in history]
    p50 = [(ago, None if q is None else q * 1000) for ago, _, q, _ in history]
    p99 = [(ago, None if q is None else q * 1000) for ago, _, _, q in history]
    return ('<div class="charts">' + _chart("fired", [("fired/s", "#2f6fdf", fired)], "per second")
            + _chart("lateness of first attempts", [("p50", "#2a8a4a", p50), ("p99", "#c62f3a", p99)], "ms")
            + "</div>")


def _in_zone(ms, trigger) -> str:
    """``ms`` in the zone of ``trigger`` (a cron's; UTC for an interval, which has none)."""
    return local_iso(ms, trigger.tz if isinstance(trigger, Cron) else dt.timezone.utc)


def _schedules(schedules: list, now_ms: int, actions: bool) -> str:
    rows = []
    for s in schedules:
        paused = '<span class="badge paused">paused</span>' if s.paused else '<span class="badge live">active</span>'
        buttons = ""
        if actions:
            buttons = f'<td class="actions">{_button("resume" if s.paused else "pause", 0, s.name.encode(), s.partition)}</td>'
        rows.append(f"<tr><td>{esc(s.partition)}</td><td>{esc(s.name)}</td><td>{esc(s.trigger)}</td>"
                    f"<td class=num>{int(s.kind)}</td><td>{esc(_in_zone(s.next_fire_ms, s.trigger))}"
                    f" <span class=muted>{esc(in_words(s.next_fire_ms, now_ms))}</span></td><td>{paused}</td>"
                    f"<td>{esc(_in_zone(s.last_fired_ms, s.trigger))}</td>{buttons}</tr>")
    return _table(["partition", "name", "trigger", "kind", "next fire", "state", "last run"] + (["actions"] if actions else []),
                  rows, "No schedule in this store.")


def _search_form(query: dict) -> str:
    states = "".join(f'<option value="{s}"{" selected" if query.get("state") == s else ""}>{s}</option>'
                     for s in ("",) + STATES)
    return ('<form class="search" method="get" action="/">'
            f'<label>partition<input name="partition" value="{_field(query.get("partition", ""))}" size="14"></label>'
            f'<label>kind<input name="kind" value="{_field(query.get("kind", ""))}" size="5"></label>'
            f'<label>state<select name="state">{states}</select></label>'
            f'<label>reference (or a part, or its hex)<input name="reference" value="{_field(query.get("reference", ""))}" '
            'size="28"></label><button class="primary" type="submit">Search</button></form>')


def _timers(data: dict, actions: bool) -> str:
    timers = data["timers"]
    if data["search_error"]:
        return f'<p class="error">{esc(data["search_error"])}</p>'
    if timers is None:
        return '<p class="muted">Search by partition, kind, state or reference (a part of one finds it).</p>'
    now_ms = data["now_ms"]
    rows = []
    for t in timers:
        buttons = ""
        if actions:
            # A schedule's occurrence is acted on through its schedule (pause, resume), never by the
            # timer actions, which name a one-off timer of (kind, reference): another timer.
            wanted = () if t.schedule else ("requeue", "fire-now", "cancel") if t.state != "scheduled" \
                else ("fire-now", "cancel")
            buttons = f'<td class="actions">{"".join(_button(a, int(t.kind), t.reference, t.partition) for a in wanted)}</td>'
        shown = ("schedule " if t.schedule else "") + _reference(t.reference)
        rows.append(f"<tr><td>{esc(t.partition)}</td><td class=num>{int(t.kind)}</td><td class=ref>{shown}</td>"
                    f'<td><span class="badge {esc(t.state)}">{esc(t.state)}</span></td><td class=num>{t.attempt}</td>'
                    f"<td>{_when(t.due_at_ms, now_ms)}</td><td class=err>{esc(t.last_error or '-')}</td>{buttons}</tr>")
    more = (f'<p class="muted">Showing the first {len(timers)}; more may match: narrow the search by partition, '
            'kind or state.</p>' if data["more"] else "")
    return _table(["partition", "kind", "reference", "state", "attempt", "due", "last error"]
                  + (["actions"] if actions else []), rows, "No pending timer matches.") + more


def _cards(data: dict) -> str:
    fleet = data["fleet"]
    parts = fleet["partitions"]
    backlog = sum(p["due_backlog"] for p in parts)
    parked = sum(p["parked"] for p in parts)
    oldest = [p["oldest_due_at_ms"] for p in parts if p["oldest_due_at_ms"] is not None]
    late = in_words(min(oldest), data["now_ms"]).replace(" ago", "") if oldest else "-"
    paused = sum(1 for s in data["schedules"] if s.paused)
    # Past the partitions the page reads, its sums are of those alone, and say so.
    of = f" (first {len(parts):,})" if fleet["partitions_total"] > len(parts) else ""
    cards = [("runners" if fleet["runners"] is not None else "runners (not recorded)",
              "-" if fleet["runners"] is None else len(fleet["runners"]), False),
             ("partitions", f"{fleet['partitions_total']:,}", False), ("due now" + of, backlog, False),
             ("oldest due, late by" + of, late, False), ("parked" + of, parked, parked > 0), ("schedules", f"{len(data['schedules'])}" + ("+" if data.get("schedules_more") else "")
                                + (f" ({paused} paused)" if paused else ""), False)]
    return '<div class="cards">' + "".join(
        f'<div class="card{" bad" if bad else ""}"><div class="n">{esc(n)}</div><div class="l">{esc(label)}</div></div>'
        for label, n, bad in cards) + "</div>"


def render(data: dict, query: dict, *, actions: bool, loopback: bool, form_token: str) -> str:
    """The page of ``data`` (:meth:`StatusPage.read`) for the search ``query``."""
    now_ms = data["now_ms"]
    fleet = data["fleet"]
    body = []
    if query.get("note"):
        body.append(f'<p class="note" id="note">{esc(query["note"])}</p>')
    if data["error"]:
        body.append(f'<p class="error">The store failed: {esc(data["error"])}</p>')
    if fleet is not None:
        body.append(f'<section id="summary" data-live>{_cards(data)}</section>')
        body.append(f'<h2>Fleet</h2><section id="fleet" data-live>{_fleet(fleet, now_ms)}</section>')
        body.append(f'<h2>Partitions</h2><section id="partitions" data-live>{_partitions(fleet, now_ms)}</section>')
    body.append(f'<h2>Fired and lateness, last {int(HISTORY_S // 60)} minutes</h2>'
                f'<section id="rates" data-live>{_rates(data["history"])}</section>')
    more = ('<p class="muted">More schedules than the page reads: <code>timerwheel-c schedules list</code> '
            'gives them all.</p>' if data.get("schedules_more") else "")
    body.append(f'<h2>Schedules</h2><section id="schedules" data-live>{_schedules(data["schedules"], now_ms, actions)}'
                f'{more}</section>')
    body.append(f"<h2>Timers</h2>{_search_form(query)}")
    body.append(f'<section id="timers" data-live>{_timers(data, actions)}</section>')
    if actions:
        back = urlencode({k: v for k, v in query.items() if k not in ("note", "sig")})
        token = (f'<input type="hidden" name="token" value="{esc(form_token)}">' if loopback else
                 '<label class="muted">action token <input type="password" name="token" autocomplete="off"></label>')
        body.append(f'<form id="act" method="post" action="/action"><input type="hidden" name="back" value="{esc(back)}">'
                    f"{token}</form>")
    backend = "-" if fleet is None else fleet["backend"]
    meta = (f"{esc(backend)} store &middot; {esc(local_iso(now_ms))} &middot; refreshes every {REFRESH_S} s"
            f" &middot; actions {'on' if actions else 'off'}")
    return _document("timerwheel_c: durable timers", f'<span class="meta">{meta}</span>', "".join(body))


def message_page(title: str, text: str) -> str:
    """A page saying ``text`` (escaped), with a link back to the status page."""
    return _document(f"timerwheel_c: {title}", "", f'<p class="error" id="message">{esc(text)}</p><p><a href="/">Back to the status page</a></p>')


def _document(title: str, meta: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,"><style>{STYLE}</style></head>'
            f'<body><header><h1>{esc(title)}</h1>{meta}</header><main>{body}</main>'
            f"<script>{SCRIPT}</script></body></html>")
