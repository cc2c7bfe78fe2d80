"""Declares the compiled extensions: each src/NAME.pyx becomes timerwheel_c.NAME."""
import sys
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = Path(__file__).parent
POSIX = sys.platform != "win32"

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
    ext_modules=cythonize(
        extensions,
        language_level=3,
        # autotestdict: no __test__ dict of docstrings (for doctest) in the compiled modules.
        compiler_directives={"boundscheck": False, "wraparound": False, "cdivision": True, "autotestdict": False},
    )
)
