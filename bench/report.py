"""Terminal output: tables on stdout and a progress bar on stderr.

rich (the ``bench`` extra) draws them when it imports; without it the same tables
print as aligned plain text and progress prints one line per workload, so
the bench works on a bare ``pip install .`` too.
"""
from __future__ import annotations

import sys
from typing import Any, Sequence

try:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table
except ImportError:  # plain-text fallback, see the module docstring
    Console = None  # type: ignore[assignment,misc]

__all__ = ["NOT_APPLICABLE", "Reporter", "Task", "fmt", "ratio"]

# What a table cell, a chart row or a goal shows for a figure that does not apply to the run.
NOT_APPLICABLE = "n/a"


def fmt(value, digits: int | None = None) -> str:
    """A number for a table cell: 3 significant figures below 1000, thousands separators above."""
    if value is None:
        return NOT_APPLICABLE
    if isinstance(value, str):
        return value
    if value != value:
        return "nan"
    if digits is not None:
        return f"{value:,.{digits}f}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def ratio(value, reference) -> str:
    """``value / reference`` as ``"12.3x"``, or ``"n/a"`` when either is missing."""
    if not isinstance(value, (int, float)) or not isinstance(reference, (int, float)) or not reference:
        return NOT_APPLICABLE
    return f"{value / reference:.1f}x" if value / reference < 100 else f"{value / reference:,.0f}x"


class Task:
    """One workload's progress bar; a no-op without rich or with ``--no-progress``.

    Also the ``progress`` callable handed to a measurement: ``task(done, total)``
    sets the bar, ``task(k)`` advances it by ``k`` units.
    """

    def __init__(self, progress, task_id) -> None:
        self._progress, self._id = progress, task_id

    def __call__(self, done: float, total: float | None = None) -> None:
        if total is None:
            self.advance(float(done))
        else:
            self.update(float(done), float(total))

    def step(self) -> None:
        if self._progress is not None:
            self._progress.advance(self._id)

    def advance(self, units: float) -> None:
        if self._progress is not None:
            self._progress.advance(self._id, units)

    def update(self, done: float, total: float) -> None:
        if self._progress is not None:
            self._progress.update(self._id, completed=done, total=total)


class Reporter:
    """Prints tables to stdout and drives one progress bar per workload on stderr."""

    def __init__(self, use_rich: bool = True, show_progress: bool = True) -> None:
        self.rich = use_rich and Console is not None
        out = Console(highlight=False) if self.rich else None
        if out is not None and not out.is_terminal:
            out = Console(highlight=False, width=140)  # a pipe or file: don't wrap at 80
        self.out: Any = out
        self._err: Any = Console(stderr=True) if self.rich else None
        self._show_progress = show_progress
        self._progress: Any = None

    def __enter__(self) -> "Reporter":
        if self.rich and self._show_progress:
            self._progress = Progress(
                TextColumn("[bold]{task.description:<10}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), console=self._err, transient=False,
            )
            self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def task(self, name: str, total: float | None) -> Task:
        """A progress task of ``total`` steps (None: open-ended) for workload ``name``."""
        if self._progress is None:
            if self._show_progress:
                print(f"bench: running {name} ...", file=sys.stderr, flush=True)
            return Task(None, None)
        return Task(self._progress, self._progress.add_task(escape(name), total=total))

    # Every text reaches rich escaped: it reads "[...]" as markup, so `pip install ".[peers]"` printed
    # `pip install "."`. The bench's text is plain; styles come as arguments only.

    def line(self, text: str, style: str = "") -> None:
        if self.rich:
            self.out.print(escape(text), style=style or None)
        else:
            print(text, flush=True)

    def table(self, title: str, headers: list[str], rows: list[list[str]], notes: Sequence[str] = ()) -> None:
        """One table: the first column left-aligned, the figures right-aligned."""
        if self.rich:
            t = Table(title=escape(title), title_justify="left", title_style="bold")
            for i, h in enumerate(headers):
                t.add_column(escape(h), justify="left" if i == 0 else "right")
            for row in rows:
                t.add_row(*(escape(str(c)) for c in row))
            self.out.print(t)
        else:
            widths = [max(len(str(r[i])) for r in [headers] + rows) for i in range(len(headers))]
            print(f"\n{title}")
            for j, row in enumerate([headers] + rows):
                cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
                print("  ".join(cells))
                if j == 0:
                    print("  ".join("-" * w for w in widths))
        for note in notes:
            self.line(f"  note: {note}", "dim")
        if not self.rich:
            print()
