"""Branch coverage per package, against floors that only rise (`make test COVERAGE=1`).

Reads the coverage data the test run left (.coverage, combined from every xdist worker by
pytest-cov), prints one line per package (statements and branches together, as coverage's
own total counts them) and fails when a package is under its floor in
.ci/coverage-floors.json. ``--raise`` writes the measured figures (rounded down) as the new
floors where they are higher; a floor is never lowered by it.

What runs in the processes of live stacks (gunicorn, Celery) is not measured: their tests
check behaviour end to end, and the same code is covered in-process by the unit tests.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import coverage

ROOT = Path(__file__).resolve().parent.parent
FLOORS = ROOT / ".ci" / "coverage-floors.json"


def package_of(path: str) -> str:
    """tasks_app/mcp/handlers/tools.py -> tasks_app.mcp; tasks_app/views.py -> tasks_app;
    config/postgresql/base.py -> config."""
    parts = Path(path).parts
    if parts[0] == "tasks_app" and len(parts) > 2:
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


def measure() -> dict[str, tuple[int, int]]:
    """Per package: (covered, total) of statements plus branches."""
    cov = coverage.Coverage(data_file=str(ROOT / ".coverage"))
    cov.load()
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cov.json_report(outfile=out.name)
        files = json.loads(Path(out.name).read_text())["files"]
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for path, report in files.items():
        summary = report["summary"]
        package = totals[package_of(str(Path(path).resolve().relative_to(ROOT)))]
        package[0] += summary["covered_lines"] + summary.get("covered_branches", 0)
        package[1] += summary["num_statements"] + summary.get("num_branches", 0)
    return {name: (covered, total) for name, (covered, total) in sorted(totals.items())}


def percent(covered: int, total: int) -> float:
    return 100.0 * covered / total if total else 100.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raise", dest="raise_floors", action="store_true")
    args = parser.parse_args()

    floors: dict[str, float] = json.loads(FLOORS.read_text()) if FLOORS.exists() else {}
    measured = measure()
    failed = []
    print(f"{'package':<24} {'covered':>8} {'of':>8} {'branch cov':>10} {'floor':>6}")
    for name, (covered, total) in measured.items():
        figure = percent(covered, total)
        floor = floors.get(name)
        shown = "" if floor is None else f"{floor:.0f}"
        mark = ""
        if floor is not None and figure < floor:
            failed.append(name)
            mark = "  UNDER THE FLOOR"
        print(f"{name:<24} {covered:>8} {total:>8} {figure:>9.1f}% {shown:>6}{mark}")
    covered = sum(c for c, _ in measured.values())
    total = sum(t for _, t in measured.values())
    print(f"{'all':<24} {covered:>8} {total:>8} {percent(covered, total):>9.1f}%")

    if args.raise_floors:
        for name, (covered, total) in measured.items():
            floors[name] = max(floors.get(name, 0), math.floor(percent(covered, total)))
        FLOORS.write_text(json.dumps(floors, indent=2, sort_keys=True) + "\n")
        print(f"floors written to {FLOORS.relative_to(ROOT)}")
    if failed:
        print(
            f"coverage under the floor in {', '.join(failed)} (.ci/coverage-floors.json): "
            "add tests for what changed; a floor is never lowered",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
