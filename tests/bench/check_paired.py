"""Paired whole-process runs of `rocmdoctor --root <fixture> check --json`: this checkout against another
(an earlier landing in its own venv), alternating one run of each so that load drifts hit both alike.

    .venv/bin/python tests/bench/check_paired.py --against /tmp/d3ee4b0/.venv/bin/rocmdoctor [--runs 30]

The same fixture (this checkout's) is given to both; the medians, minima and the ratio are printed.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def once(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system of the child) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(argv, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        sys.exit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-500:]}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--against", required=True, help="the other checkout's rocmdoctor executable")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--fixture", default="strix-halo-clean")
    args = parser.parse_args()
    tail = ["--root", str(REPO / "tests/fixtures/hosts" / args.fixture), "check", "--json"]
    ours, theirs = [str(Path(sys.executable).parent / "rocmdoctor"), *tail], [args.against, *tail]
    for argv in (ours, theirs, ours, theirs):
        once(argv)  # warm the page cache and the .pyc files
    now: list[tuple[float, float]] = []
    before: list[tuple[float, float]] = []
    for _ in range(args.runs):
        before.append(once(theirs))
        now.append(once(ours))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"command: rocmdoctor {' '.join(tail)}, {args.runs} alternating pairs")
    for what, i in (("wall", 0), ("CPU", 1)):
        b, n = [r[i] for r in before], [r[i] for r in now]
        for name, runs in (("before", b), ("now", n)):
            med, low, high = statistics.median(runs), min(runs), max(runs)
            print(f"{what} {name}: median {med:.3f} s, min {low:.3f} s, max {high:.3f} s")
        ratio, low_ratio = statistics.median(n) / statistics.median(b), min(n) / min(b)
        print(f"{what} ratio now/before: median {ratio:.2f}, min {low_ratio:.2f}")


if __name__ == "__main__":
    main()
