"""What a built distribution must (and must not) hold; run by .ci/run.

    python .ci/check_dist.py wheel PATH.whl    # what users install
    python .ci/check_dist.py sdist PATH.tar.gz # what a build from source needs

The wheel holds the package and nothing else: compiled cores with their .pyi stubs and .pxd
declarations, py.typed, the pure twins, and the licence in its metadata; no C or Cython sources, no tests, no bench, no compiled
module that exists only to be timed. Its platform tag is a manylinux one (after auditwheel) on
Linux. The sdist carries every Cython source and C header a build reads, the licence, and no
generated C.
Prints the file's size
and exits 1 naming each missing or unwanted file.
"""
from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
# The compiled cores (src/NAME.pyx): each ships as an extension module and its stub, and with its
# declarations where it has a src/NAME.pxd (setup.py's rule).
CORES = sorted(p.stem for p in SRC.glob("*.pyx"))
PXDS = sorted(p.stem for p in SRC.glob("*.pxd") if p.with_suffix(".pyx").exists())


def _wheel_problems(path: Path) -> list[str]:
    names = zipfile.ZipFile(path).namelist()
    problems = [f"unwanted {name}" for name in names
                if name.endswith((".c", ".pyx", ".pxi", ".h")) or name.startswith(("tests/", "bench/"))
                or "/bench/" in name or "_baseline" in name]
    top = {name.split("/", 1)[0] for name in names}
    problems += [f"unwanted top-level {t}" for t in sorted(top)
                 if t != "timerwheel_c" and not t.endswith((".dist-info", ".libs"))]
    expected = [f"timerwheel_c/{c}.pyi" for c in CORES] + [f"timerwheel_c/{c}.pxd" for c in PXDS]
    problems += [f"missing {name}" for name in expected if name not in names]
    for core in CORES:
        if not any(n.startswith(f"timerwheel_c/{core}.") and n.endswith((".so", ".pyd")) for n in names):
            problems.append(f"missing the compiled timerwheel_c/{core}")
    if "timerwheel_c/py.typed" not in names:
        problems.append("missing timerwheel_c/py.typed")
    if not any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names):
        problems.append("missing the LICENSE in its .dist-info (the MIT licence asks that its notice ship)")
    if sys.platform.startswith("linux") and "manylinux" not in path.name:
        problems.append(f"{path.name} has no manylinux tag (not repaired by auditwheel)")
    return problems


def _sdist_problems(path: Path) -> list[str]:
    names = {name.split("/", 1)[1] for name in tarfile.open(path).getnames() if "/" in name}
    needed = sorted(f"src/{p.name}" for p in SRC.iterdir() if p.suffix in (".pyx", ".pxd", ".pxi", ".h"))
    needed += ["setup.py", "pyproject.toml", "MANIFEST.in", "timerwheel_c/py.typed", "LICENSE"]
    # Generated C compiles in the numpy it was generated for; a build from the sdist makes its own.
    return ([f"missing {name}" for name in needed if name not in names]
            + [f"unwanted generated {name}" for name in sorted(names) if name.endswith(".c")])


def main(kind: str, path: str) -> int:
    dist = Path(path)
    problems = {"wheel": _wheel_problems, "sdist": _sdist_problems}[kind](dist)
    print(f"+ {kind} {dist.name}: {dist.stat().st_size:,} bytes")
    for problem in problems:
        print(f"check_dist: {dist.name}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
