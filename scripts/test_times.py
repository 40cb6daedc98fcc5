#!/usr/bin/env python3
"""Per-module test time from a pytest JUnit XML file (``pytest --junitxml=FILE``).

    python scripts/test_times.py results.xml [--markdown] [--slowest N]

A test's time is its setup, call and teardown, so a module-scoped stack is charged to the first test
that needed it, and the session stack to the suite's first test.
"""

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict


def cases(path: str) -> list[tuple[str, str, float]]:
    """(module, test name, seconds) of every test in the file."""
    return [(c.get("classname", "").removeprefix("tests.").split(".")[0], c.get("name", ""), float(c.get("time", 0)))
            for c in ET.parse(path).getroot().iter("testcase")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--slowest", type=int, default=0)
    args = parser.parse_args()
    found = cases(args.junit)
    tests, seconds = defaultdict(int), defaultdict(float)
    for module, _, s in found:
        tests[module] += 1
        seconds[module] += s
    total = sum(seconds.values())
    rows = [(m, tests[m], f"{seconds[m] / 60:.1f}", f"{100 * seconds[m] / total:.0f}%")
            for m in sorted(seconds, key=seconds.get, reverse=True)]
    rows.append(("total", sum(tests.values()), f"{total / 60:.1f}", ""))
    if args.markdown:
        print("| module | tests | minutes | share |\n|---|---:|---:|---:|")
        print("\n".join("| " + " | ".join(map(str, row)) + " |" for row in rows))
    else:
        print("\n".join("{:<24} {:>4} {:>6} {:>5}".format(*row) for row in rows))
    for module, name, s in sorted(found, key=lambda c: -c[2])[:args.slowest]:
        print(f"{s:7.1f}s  {module}::{name}")


if __name__ == "__main__":
    main()
