"""Chooses, once per process, between the compiled cores and their pure-Python twins.

The rule follows aio-libs (propcache, multidict):

- ``TIMERWHEEL_C_NO_EXTENSIONS=1`` forces the pure twins;
- an interpreter other than CPython forces the pure twins;
- an extension that fails to import falls back to its pure twin with a warning,
  unless ``TIMERWHEEL_C_REQUIRE_EXTENSIONS=1`` is set (as in CI), where it is an
  ImportError, so a broken build can never pass as green.

``IMPLEMENTATION`` is ``"c"`` when every core loaded compiled, else ``"pure"``.
"""
from __future__ import annotations

import importlib
import os
import platform
import warnings
from types import ModuleType

__all__ = ["IMPLEMENTATION", "load"]


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


_FORCE_PURE = _flag("TIMERWHEEL_C_NO_EXTENSIONS") or platform.python_implementation() != "CPython"
_REQUIRE = _flag("TIMERWHEEL_C_REQUIRE_EXTENSIONS")

IMPLEMENTATION = "pure" if _FORCE_PURE else "c"


def load(name: str) -> ModuleType:
    """Return the core module ``name``: ``timerwheel_c.<name>`` compiled, else ``timerwheel_c.pure.<name>``.

    ``name`` is the stem shared by ``src/_<name>.pyx`` and ``timerwheel_c/pure/<name>.py``.

    Raises:
        ImportError: the extension did not import and ``TIMERWHEEL_C_REQUIRE_EXTENSIONS=1`` is set.
    """
    global IMPLEMENTATION
    if not _FORCE_PURE:
        try:
            return importlib.import_module(f"timerwheel_c._{name}")
        except ImportError as exc:
            if _REQUIRE:
                raise ImportError(
                    f"timerwheel_c._{name} did not import and TIMERWHEEL_C_REQUIRE_EXTENSIONS=1 "
                    f"forbids the pure fallback: {exc}"
                ) from exc
            warnings.warn(
                f"timerwheel_c._{name} did not import ({exc}); using the pure-Python twin",
                RuntimeWarning,
                stacklevel=3,
            )
    IMPLEMENTATION = "pure"
    return importlib.import_module(f"timerwheel_c.pure.{name}")
