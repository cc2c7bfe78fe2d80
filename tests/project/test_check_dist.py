"""The distribution checks CI runs (.ci/check_dist.py) catch what must not ship and what must.

Built from fake archives in a temporary directory: nothing is compiled, nothing is timed. (CI
runs the same checks on the real sdist and wheel.)
"""
from __future__ import annotations

import importlib.util
import tarfile
import zipfile
from pathlib import Path

import pytest

from locations import CHECKOUT

SCRIPT = CHECKOUT / ".ci" / "check_dist.py"

pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason="needs the checkout's .ci/")


@pytest.fixture(scope="module")
def check_dist():
    spec = importlib.util.spec_from_file_location("check_dist", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _wheel(path: Path, names: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name in names:
            z.writestr(name, "")
    return path


def _good_names(check_dist) -> list[str]:
    return (["timerwheel_c/__init__.py", "timerwheel_c/py.typed", "timerwheel_c-0.1.0.dist-info/RECORD",
             "timerwheel_c-0.1.0.dist-info/licenses/LICENSE"]
            + [f"timerwheel_c/{c}.cpython-311-x86_64-linux-gnu.so" for c in check_dist.CORES]
            + [f"timerwheel_c/{c}.pyi" for c in check_dist.CORES]
            + [f"timerwheel_c/{c}.pxd" for c in check_dist.PXDS])


def test_a_wheel_with_the_package_alone_passes(check_dist, tmp_path, capsys):
    """Compiled cores, stubs, declarations and py.typed, nothing else: exit 0, the size printed."""
    assert check_dist.CORES and check_dist.PXDS  # read from src/, so not vacuous
    wheel = _wheel(tmp_path / "timerwheel_c-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl", _good_names(check_dist))
    assert check_dist.main("wheel", str(wheel)) == 0
    assert "bytes" in capsys.readouterr().out


def test_a_wheel_shipping_sources_tests_or_bench_or_missing_stubs_fails_naming_each(check_dist, tmp_path, capsys):
    names = [n for n in _good_names(check_dist) if not n.endswith(("py.typed", "_wheel.pyi", "LICENSE"))]
    names += ["timerwheel_c/_wheel.pyx", "timerwheel_c/_wheel.c", "tests/test_wheel.py", "bench/run.py",
              "timerwheel_c/_baseline.cpython-311-x86_64-linux-gnu.so"]
    wheel = _wheel(tmp_path / "timerwheel_c-0.1.0-cp311-cp311-linux_x86_64.whl", names)
    assert check_dist.main("wheel", str(wheel)) == 1
    err = capsys.readouterr().err
    for needle in ("unwanted timerwheel_c/_wheel.pyx", "unwanted timerwheel_c/_wheel.c", "unwanted tests/test_wheel.py",
                   "unwanted bench/run.py", "_baseline", "missing timerwheel_c/py.typed",
                   "missing timerwheel_c/_wheel.pyi", "missing the LICENSE"):
        assert needle in err, needle
    if check_dist.sys.platform.startswith("linux"):
        assert "no manylinux tag" in err


def test_an_sdist_without_a_cython_source_fails_naming_it(check_dist, tmp_path, capsys):
    sdist = tmp_path / "timerwheel_c-0.1.0.tar.gz"
    members = ["setup.py", "pyproject.toml", "MANIFEST.in", "timerwheel_c/py.typed", "LICENSE"]
    members += [f"src/{p.name}" for p in (CHECKOUT / "src").iterdir() if p.name != "_release.pyx"]
    with tarfile.open(sdist, "w:gz") as tar:
        for name in members:
            info = tarfile.TarInfo(f"timerwheel_c-0.1.0/{name}")
            tar.addfile(info)
    assert check_dist.main("sdist", str(sdist)) == 1
    assert capsys.readouterr().err.strip().endswith("missing src/_release.pyx")
