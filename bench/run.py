"""Start the bench against the *installed* timerwheel_c: ``python bench/run.py --quick``.

The bench lives in the repository, never in the wheel, so it is started by path. Python puts
this script's directory first on ``sys.path``; that entry is dropped (so ``plot``, ``report``
and the other module names here can never shadow a library's), and the package is loaded from
this directory by location. The repository root is never put on ``sys.path`` either, so
``import timerwheel_c`` always finds the installed package, never the uncompiled source tree
beside this directory (without an installed package the bench stops and says so).

``python bench/run.py -m bench.MODULE ARGS...`` runs one of the bench's own modules as
``__main__`` the same way: the bench starts its server and runner subprocesses through it
(:func:`command`).
"""
from __future__ import annotations

import importlib.util
import runpy
import sys
from pathlib import Path

__all__ = ["command", "load", "main"]

HERE = Path(__file__).resolve().parent


def load() -> None:
    """Make ``import bench`` find this directory's package (idempotent), with no ``sys.path`` entry."""
    if sys.path and Path(sys.path[0] or ".").resolve() == HERE:
        del sys.path[0]
    if "bench" in sys.modules:
        return
    spec = importlib.util.spec_from_file_location("bench", HERE / "__init__.py", submodule_search_locations=[str(HERE)])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench"] = module
    spec.loader.exec_module(module)


def command(module: str, *args: str) -> list[str]:
    """The argv that runs the bench module ``module`` (``"bench.echo_server"``) as ``__main__`` in a
    new interpreter, importing the same installed timerwheel_c as this process."""
    return [sys.executable, str(HERE / "run.py"), "-m", module, *args]


def main(argv: list[str]) -> int:
    """Run the bench CLI on ``argv``, or ``-m MODULE ARGS...`` (see the module docstring)."""
    load()
    try:
        import timerwheel_c  # noqa: F401
    except ImportError as exc:
        print(f"bench: error: timerwheel_c is not installed ({exc}); run: pip install '.[bench]'", file=sys.stderr)
        return 2
    if argv[:1] == ["-m"] and len(argv) >= 2:
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    from bench.cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
