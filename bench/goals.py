"""Goals: a figure judged against a bound, shown the same way in every table, note and JSON.

A workload that has goals declares each as a :class:`Goal` (its workload, what is
measured, "at most" or "at least" a bound, in a unit) and judges it on its own figures
with :meth:`Goal.judge`, which gives the JSON-ready verdict
``{"workload", "name", "goal", "measured", "unit", "met", "set_at"}``: ``met`` is True, False,
or None when the figure does not apply to this run (an implementation not built, a series
the run could not take), shown as "n/a". A goal is stated at a size (100,000 connections, say);
measured at another (``--quick``, ``--scale``) it is not judged either: ``set_at`` then names
the size it was set for, and it shows as "n/a: set at ...", with the value this run measured.

:func:`line` is the one-line form (a table note), :func:`rows` the table form and
:func:`summary` the count. A missed goal is reported, never hidden, but it does not change
the bench's exit status: goals are speeds of this machine under its present load, while
the exit status says whether the run itself was correct.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Callable, Optional

from .report import NOT_APPLICABLE, Reporter, fmt

__all__ = ["HEADERS", "Goal", "line", "print_alone", "rows", "style", "summary"]

HEADERS = ["goal", "target", "measured", "met"]


def _with_unit(value: float, unit: str) -> str:
    """``value`` in ``unit`` for a reader: ratios as ``12.3x``, others as ``12.3 us``."""
    return f"{fmt(value)}x" if unit == "x" else f"{fmt(value)} {unit}"


@dataclass(frozen=True)
class Goal:
    """In ``workload``, ``name`` (what is measured) at most / at least ``bound``, in ``unit``.

    ``unit`` is ``"x"`` for a ratio of two figures (cost / reference), else the unit of
    the figure itself (``"us"``, ``"ms"``, ``"fired/s"``).
    """

    workload: str
    name: str
    bound: float
    at_most: bool
    unit: str = "x"

    def target(self) -> str:
        """The goal as text: ``<= 1.5x``, ``>= 5,000 fired/s``."""
        return f"{'<=' if self.at_most else '>='} {_with_unit(self.bound, self.unit)}"

    def judge(self, measured: Optional[float], set_at: Optional[str] = None) -> dict:
        """The verdict on ``measured`` (in ``unit``; None or NaN when it does not apply);
        ``set_at`` (``"100,000 connections"``) when the run's size is not the one the goal is set for."""
        value = None if measured is None or math.isnan(measured) else float(measured)
        met = None if value is None or set_at else (value <= self.bound if self.at_most else value >= self.bound)
        return {"workload": self.workload, "name": self.name, "goal": self.target(), "measured": value,
                "unit": self.unit, "met": met, "set_at": set_at}


def _measured(verdict: dict) -> str:
    return NOT_APPLICABLE if verdict["measured"] is None else _with_unit(verdict["measured"], verdict["unit"])


def _met(verdict: dict) -> str:
    if verdict.get("set_at"):
        return f"{NOT_APPLICABLE}: set at {verdict['set_at']}"
    return NOT_APPLICABLE if verdict["met"] is None else ("met" if verdict["met"] else "NOT met")


def line(verdict: dict) -> str:
    """One verdict as a sentence: ``goal: NAME <= 1.5x; measured 1.23x: met``."""
    return f"goal: {verdict['name']} {verdict['goal']}; measured {_measured(verdict)}: {_met(verdict)}"


def print_alone(figures: dict, verdicts: list[dict], table: Callable[[Reporter, dict], None], as_json: bool) -> None:
    """A workload module run on its own prints its ``figures`` with their ``verdicts``: one JSON
    object (the figures plus ``goals``), or ``table``'s plain table then a line per verdict."""
    if as_json:
        print(json.dumps({**figures, "goals": verdicts}))
        return
    table(Reporter(use_rich=False, show_progress=False), figures)
    for verdict in verdicts:
        print(line(verdict))


def rows(verdicts: list[dict]) -> list[list[str]]:
    """Verdicts as table rows under :data:`HEADERS`, each goal named ``workload: name``."""
    return [[f"{v['workload']}: {v['name']}", v["goal"], _measured(v), _met(v)] for v in verdicts]


def style(verdict: dict) -> str:
    """The Reporter style of a verdict's line: missed goals stand out, n/a ones recede."""
    return {True: "", False: "yellow", None: "dim"}[verdict["met"]]


def summary(verdicts: list[dict]) -> str:
    """How many goals were met, missed and not applicable, and what a miss means."""
    met = sum(v["met"] is True for v in verdicts)
    missed = sum(v["met"] is False for v in verdicts)
    text = f"{met} of {len(verdicts)} goals met"
    if missed:
        text += f", {missed} NOT met"
    if len(verdicts) - met - missed:
        text += f", {len(verdicts) - met - missed} {NOT_APPLICABLE}"
    return text + ("; a missed goal leaves the exit status 0: goals are speeds of this machine under its "
                   "present load, the exit status says whether the run was correct")
