"""Chooses, once per process, between the compiled cores and their pure-Python twins.

The rule follows aio-libs (propcache, multidict):

- ``TIMERWHEEL_C_NO_EXTENSIONS=1`` forces the pure twins;
- an interpreter other than CPython forces the pure twins;
- an extension that fails to import falls back to its pure twin with a warning,
  unless ``TIMERWHEEL_C_REQUIRE_EXTENSIONS=1`` is set (as in CI), where it is an
  ImportError, so a broken build can never pass as green.

Both variables are switches read alike: ``1``, ``true``, ``yes`` or ``on`` turn one on; unset,
empty, ``0``, ``false``, ``no`` or ``off`` leave it off (any case, blanks around ignored); any other
value is a ValueError at import naming it, so that ``=false`` never means the opposite.

``IMPLEMENTATION`` is ``"c"`` when every core loaded compiled, else ``"pure"``.
"""
from __future__ import annotations

import importlib
import os
import platform
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

__all__ = ["FALLBACK_REASON", "IMPLEMENTATION", "load"]


_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


def _flag(name: str) -> bool:
    """The switch ``$name`` (see the module docstring).

    Raises:
        ValueError: a value that is neither on nor off, naming the variable and the value.
    """
    value = os.environ.get(name, "").strip().lower()
    if value not in _ON + _OFF:
        raise ValueError(f"{name} must be one of {', '.join(_ON)} (on) or unset, empty, {', '.join(_OFF[1:])} "
                         f"(off), got {os.environ[name]!r}")
    return value in _ON


_FORCE_PURE = _flag("TIMERWHEEL_C_NO_EXTENSIONS") or platform.python_implementation() != "CPython"
_REQUIRE = _flag("TIMERWHEEL_C_REQUIRE_EXTENSIONS")

IMPLEMENTATION = "pure" if _FORCE_PURE else "c"
# Why a compiled core fell back to its pure twin, or None: unlike a forced pure run, a
# fallback is an accident that a benchmark or a user comparing speeds must hear about.
FALLBACK_REASON: Optional[str] = None


def _why_not_compiled(name: str, exc: ImportError) -> str:
    package_dir = Path(__file__).resolve().parent
    if (package_dir.parent / "src" / f"_{name}.pyx").exists():
        # `python -m ...` or a REPL started in the checkout puts it first on sys.path.
        return (
            f"timerwheel_c is imported from its source checkout ({package_dir}), which holds no "
            "compiled extensions: run from another directory, or as `python -I -m ...`, to use the "
            "installed package"
        )
    return f"timerwheel_c._{name} did not import ({exc})"


def load(name: str) -> ModuleType:
    """Return the core module ``name``: ``timerwheel_c.<name>`` compiled, else ``timerwheel_c.pure.<name>``.

    ``name`` is the stem shared by ``src/_<name>.pyx`` and ``timerwheel_c/pure/<name>.py``.

    Raises:
        ImportError: the extension did not import and ``TIMERWHEEL_C_REQUIRE_EXTENSIONS=1`` is set.
    """
    global IMPLEMENTATION, FALLBACK_REASON
    if not _FORCE_PURE:
        try:
            return importlib.import_module(f"timerwheel_c._{name}")
        except ImportError as exc:
            reason = _why_not_compiled(name, exc)
            if _REQUIRE:
                raise ImportError(
                    f"{reason}, and TIMERWHEEL_C_REQUIRE_EXTENSIONS=1 forbids the pure fallback"
                ) from exc
            if FALLBACK_REASON is None:  # one warning a process: the cores fall back together
                FALLBACK_REASON = reason
                warnings.warn(f"{reason}; using the pure-Python twins", RuntimeWarning, stacklevel=3)
    IMPLEMENTATION = "pure"
    return importlib.import_module(f"timerwheel_c.pure.{name}")
