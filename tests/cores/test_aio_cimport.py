"""The C-level API: a tiny Cython extension, compiled here against the *installed* package's
``.pxd`` files (and numpy's include path), drives a TimerWheel, a WheelScheduler and its
KeyedTimers through their ``c_*`` methods.

It proves the declarations ship in the package and match the compiled modules' layout (a
mismatch would fail to import, or corrupt memory, which the assertions would see). The build
runs in a subprocess, in a few seconds; it is skipped, saying why, only without a C compiler.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

import timerwheel_c

pytestmark = pytest.mark.c_extension

EXTENSION = textwrap.dedent("""
    # cython: language_level=3
    from libc.stdint cimport uint64_t
    from timerwheel_c._wheel cimport TimerWheel, tw_fired_t
    from timerwheel_c._aio cimport KeyedTimers, WheelHandle, WheelScheduler

    def drive_wheel(TimerWheel wheel):
        cdef tw_fired_t fired
        cdef uint64_t a = wheel.c_schedule(10, 1)
        cdef uint64_t b = wheel.c_schedule(20, 2)
        wheel.c_schedule(20, 3)
        assert wheel.c_reschedule(a, 30) == 1 and wheel.c_cancel(b) and not wheel.c_cancel(b)
        assert wheel.c_count() == 2 and wheel.c_due_ms(a) == wheel.c_now_ms() + 30
        assert wheel.c_next_fire_ms() == wheel.c_now_ms() + 20
        wheel.c_advance(wheel.c_now_ms() + 30, &fired)
        tokens = [fired.tokens[i] for i in range(fired.count)]
        wheel.c_release(&fired)
        return tokens

    def arm(WheelScheduler sched, KeyedTimers keys, callback):
        cdef WheelHandle h = sched.c_call_later(0.01, callback, ("handle",))
        cdef WheelHandle dropped = sched.c_call_later(0.01, callback, ("dropped",))
        assert sched.c_reschedule(h, 0.02) and sched.c_time() > 0
        sched.c_cancel(dropped)
        assert not sched.c_reschedule(dropped, 0.01)
        keys.c_arm(5, 0.01)
        keys.c_arm(6, 0.01)
        assert keys.c_cancel(6) and not keys.c_cancel(6)
        return h
""")

SETUP = textwrap.dedent("""
    import sys
    from Cython.Build import cythonize
    from setuptools import Extension, setup
    setup(
        script_args=["build_ext", "--inplace", "-q"],
        ext_modules=cythonize(
            [Extension("tw_client", ["tw_client.pyx"], include_dirs=[sys.argv[2]])],
            include_path=[sys.argv[1]], quiet=True,
        ),
    )
""")


def _compiler_missing() -> str | None:
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc!r} is not on PATH)"
    return None


def test_a_cython_extension_cimports_the_installed_declarations(tmp_path):
    """Build the extension against the installed timerwheel_c/*.pxd, then drive it: the wheel
    fires the right tokens in order, and the scheduler's handle and keys fire on the loop."""
    reason = _compiler_missing()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("Cython", reason="Cython (a test extra) builds the extension")
    numpy = pytest.importorskip("numpy")
    package_dir = Path(timerwheel_c.__file__).resolve().parent
    assert (package_dir / "_wheel.pxd").exists() and (package_dir / "_aio.pxd").exists()
    (tmp_path / "tw_client.pyx").write_text(EXTENSION)
    (tmp_path / "setup.py").write_text(SETUP)
    build = subprocess.run(
        [sys.executable, "setup.py", str(package_dir.parent), numpy.get_include()],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    drive = textwrap.dedent("""
        import asyncio, tw_client
        from timerwheel_c import TimerWheel
        from timerwheel_c.aio import WheelScheduler
        assert tw_client.drive_wheel(TimerWheel(0)) == [3, 1]
        async def main():
            sched = WheelScheduler()
            fired = []
            keys = sched.keyed(lambda key: fired.append(key))
            h = tw_client.arm(sched, keys, fired.append)
            while len(fired) < 2:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.03)
            sched.close()
            # the order of the two fires depends on when key 5 was armed relative to the handle's
            # re-arm, which a loaded machine can stretch: the test is that both fire, once
            return sorted(fired, key=str), h.cancelled()
        print(asyncio.run(main()))
    """)
    run = subprocess.run([sys.executable, "-c", drive], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "([5, 'handle'], False)"
