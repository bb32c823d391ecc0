"""The tests that `make test` leaves to `make test-heavy` (and CI): those a timed run measured at or over a
threshold (default 8 s), written to tests/heavy_tests.txt, which tests/conftest.py reads to mark them `heavy`.

    .venv/bin/python -m pytest -m "not slow and not gpu and not slurm" -n 3 --junitxml=/tmp/t.xml
    .venv/bin/python tools/heavy_tests.py /tmp/t.xml [more.xml]  # rewrites tests/heavy_tests.txt

Times come from that machine under that load: the list is a measurement, regenerated when the suite changes.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

LIST = Path(__file__).resolve().parents[1] / "tests" / "heavy_tests.txt"
HEADER = ("# Tests measured at or over {threshold:g} s (tools/heavy_tests.py from a junit file): marked `heavy`\n"
          "# by tests/conftest.py, run by `make test-heavy` and CI, not by `make test`. One pytest node id per line.\n")


def node_id(classname: str, name: str) -> str:
    """A junit testcase as its pytest node id: `tests.test_x[.Class]` + `name` -> tests/test_x.py[::Class]::name
    (without the `@group` xdist appends under --dist loadgroup); `classname::name` where no part names a test file."""
    parts = classname.split(".")
    module = next((i for i in range(len(parts), 0, -1) if parts[i - 1].startswith("test_")), None)
    if module is None:
        return f"{classname}::{name}"
    path = "/".join(parts[:module]) + ".py"
    return "::".join([path, *parts[module:], name.split("@", 1)[0]])


def testcases(junit: Path) -> Iterator[tuple[str, ET.Element]]:
    """Each test of a junit file: its node id and its <testcase> element (time, failure/error/skipped)."""
    for case in ET.parse(junit).iter("testcase"):
        yield node_id(case.get("classname", ""), case.get("name", "")), case


def heavy(junits: list[Path], threshold: float) -> list[str]:
    """The node ids at or over `threshold` seconds in any of the junit files (a test's longest time)."""
    return sorted({i for junit in junits for i, case in testcases(junit) if float(case.get("time", 0)) >= threshold})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, nargs="+", help="junit files of timed runs (a test's longest time counts)")
    parser.add_argument("--threshold", type=float, default=8.0, help="seconds (default 8)")
    args = parser.parse_args(argv)
    ids = heavy(args.junit, args.threshold)
    LIST.write_text(HEADER.format(threshold=args.threshold) + "".join(f"{i}\n" for i in ids))
    print(f"{len(ids)} tests at or over {args.threshold:g} s -> {LIST}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
