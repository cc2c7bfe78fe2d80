"""The floor row: ``_baseline.pyx`` (an empty compiled method), built here on first use.

The churn goals are stated against a call of an empty Cython method with the wheel's
signatures. That extension exists only to be timed, so it ships in no wheel: the first run
compiles it with Cython and the C compiler (the ``bench`` extra brings Cython and setuptools),
with the flags setup.py gives the cores, into ``build/bench-floor/`` of this repository; later
runs load that build while the source, the Python version and Cython's version are unchanged.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import io
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType

from .harness import NotAvailable

__all__ = ["load"]

SOURCE = Path(__file__).resolve().with_name("_baseline.pyx")
CACHE = SOURCE.parent.parent / "build" / "bench-floor"
NAME = "_baseline"
# setup.py's flags for the cores, so the floor is compiled as they are.
COMPILE_ARGS = ["/O2"] if sys.platform == "win32" else ["-O2", "-pthread"]


def _build_dir(cython_version: str) -> Path:
    """The cache directory of this source, interpreter and Cython."""
    key = hashlib.sha256(SOURCE.read_bytes() + cython_version.encode()).hexdigest()[:16]
    return CACHE / f"{sysconfig.get_config_var('SOABI') or sys.implementation.cache_tag}-{key}"


def _compile(out: Path) -> None:
    from Cython.Build import cythonize
    from setuptools import Distribution, Extension

    ext = Extension(NAME, [str(SOURCE)], extra_compile_args=COMPILE_ARGS)
    dist = Distribution({"ext_modules": cythonize([ext], build_dir=str(out / "c"), quiet=True, language_level=3),
                         "script_args": ["build_ext", "--build-lib", str(out), "--build-temp", str(out / "tmp")]})
    dist.verbose = 0
    # setuptools reports progress on stdout; the bench's stdout holds its tables only.
    with contextlib.redirect_stdout(io.StringIO()):
        dist.parse_command_line()
        dist.run_commands()


def load() -> ModuleType:
    """The compiled floor module, built first if this source has no build for this interpreter.

    Raises:
        NotAvailable: Cython or setuptools is not installed, or the build failed (the
            reason is in the message).
    """
    try:
        import Cython
    except ImportError:
        raise NotAvailable("the floor is compiled on first use and needs Cython: pip install '.[bench]'") from None
    out = _build_dir(Cython.__version__)
    built = [p for s in importlib.machinery.EXTENSION_SUFFIXES for p in out.glob(NAME + s)]
    if not built:
        # Built beside, then renamed into place: bench runs started at once (the test suite's
        # pytest-xdist workers) each build their own and never load a module another one is writing.
        CACHE.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=CACHE))
        try:
            _compile(scratch)
        except (Exception, SystemExit) as exc:  # distutils reports a compiler failure as SystemExit
            shutil.rmtree(scratch, ignore_errors=True)
            raise NotAvailable(f"compiling {SOURCE.name} failed: {exc}") from exc
        try:
            scratch.rename(out)
        except OSError:  # another run's build got there first: it is the same build
            shutil.rmtree(scratch, ignore_errors=True)
        built = [p for s in importlib.machinery.EXTENSION_SUFFIXES for p in out.glob(NAME + s)]
        if not built:
            raise NotAvailable(f"compiling {SOURCE.name} left no extension module in {out}")
    spec = importlib.util.spec_from_file_location(f"bench.{NAME}", built[0])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
