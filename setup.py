"""Declares the compiled extensions: each src/NAME.pyx becomes timerwheel_c.NAME.

The C-level declarations (src/NAME.pxd) ship in the package as timerwheel_c/NAME.pxd, so other
Cython extensions can ``cimport timerwheel_c.NAME``. While building, the same files are laid out
that way in build/cython_include, so the cores cimport each other by their package names.
"""
import shutil
import sys
from pathlib import Path

import Cython
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent
POSIX = sys.platform != "win32"
# The declarations of the compiled modules (not of the C helpers they share among themselves).
PXDS = [pxd for pxd in sorted((HERE / "src").glob("*.pxd")) if pxd.with_suffix(".pyx").exists()]


def _copy_pxds(package_dir: Path) -> None:
    """Copy every src/NAME.pxd to ``package_dir``/NAME.pxd."""
    package_dir.mkdir(parents=True, exist_ok=True)
    for pxd in PXDS:
        shutil.copyfile(pxd, package_dir / pxd.name)


class BuildPyWithPxd(build_py):
    """build_py that also installs src/*.pxd into the package (next to the compiled modules)."""

    def run(self):
        super().run()
        _copy_pxds(Path(self.build_lib) / "timerwheel_c")


CYTHON_INCLUDE = HERE / "build" / "cython_include"
# The generated C goes to a directory of its own per interpreter, Cython and numpy (whose
# __init__.pxd it compiles in), never beside the sources: C generated for one numpy must not be
# compiled against another's headers, and the sdist carries the Cython sources, not their C.
GENERATED_C = HERE / "build" / f"cython-{sys.implementation.cache_tag}-{Cython.__version__}-numpy{numpy.__version__}"
_copy_pxds(CYTHON_INCLUDE / "timerwheel_c")
(CYTHON_INCLUDE / "timerwheel_c" / "__init__.pxd").touch()

extensions = [
    Extension(
        f"timerwheel_c.{pyx.stem}",
        [str(pyx.relative_to(HERE))],
        include_dirs=["src", numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=["-O2", "-pthread"] if POSIX else ["/O2"],
        extra_link_args=["-pthread"] if POSIX else [],
    )
    for pyx in sorted((HERE / "src").glob("*.pyx"))
]

setup(
    cmdclass={"build_py": BuildPyWithPxd},
    ext_modules=cythonize(
        extensions,
        language_level=3,
        include_path=[str(CYTHON_INCLUDE)],
        build_dir=str(GENERATED_C),
        # autotestdict: no __test__ dict of docstrings (for doctest) in the compiled modules.
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True, "autotestdict": False},
    ),
)
