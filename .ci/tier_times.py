"""Print, per tier of tests/ (its folders, as the README lists them), how many tests the run's
JUnit XML report holds and their summed time in seconds. Under pytest-xdist the sum is the tier's
share of both workers' time, not wall time.

    python .ci/tier_times.py REPORT.xml
"""
from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET


def tier(classname: str) -> str:
    # "tests.durable.storage.test_x" -> "durable/storage"; "tests.cores.test_x.TestY" -> "cores"
    parts = classname.split(".")[1:]
    folders = [p for p in parts[:-1] if not p.startswith(("test_", "Test"))]
    return "/".join(folders[:2] if folders[:1] == ["durable"] else folders[:1]) or "(top)"


def main(path: str) -> None:
    count: collections.Counter = collections.Counter()
    seconds: collections.Counter = collections.Counter()
    for case in ET.parse(path).getroot().iter("testcase"):
        name = tier(case.get("classname", ""))
        count[name] += 1
        seconds[name] += float(case.get("time") or 0.0)
    print("+ time per tier (tests, summed seconds):")
    for name in sorted(seconds, key=seconds.__getitem__, reverse=True):
        print(f"    {name:<18} {count[name]:>5} {seconds[name]:>8.1f}")


if __name__ == "__main__":
    main(sys.argv[1])
