"""The facts a benchmark figure is meaningless without: CPU, cores, Python, versions."""
from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

__all__ = ["facts"]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def facts() -> dict:
    """Return the machine and software facts as a flat, JSON-ready dict of strings and ints."""
    import timerwheel_c

    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    out = {
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": affinity,
        "load_avg_1m_at_start": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "machine": platform.machine(),
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "timerwheel_c": getattr(timerwheel_c, "__version__", None),
        "IMPLEMENTATION": timerwheel_c.IMPLEMENTATION,
        "timerwheel_c_path": os.path.dirname(timerwheel_c.__file__),
    }
    for dist in ("numpy", "Cython", "uvloop", "rich", "matplotlib", "psycopg"):
        out[dist if dist != "Cython" else "cython_installed"] = _version(dist)
    out["executable"] = sys.executable
    return out
