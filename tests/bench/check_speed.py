"""Wall time of `rocmdoctor check --json --root <fixture>` as whole processes, against
`python -m vllm.collect_env` (vLLM's own environment report) where vLLM is installed.

    .venv/bin/python tests/bench/check_speed.py [--runs 20] [--vllm-runs 3] [--fixture strix-halo-clean]
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
VLLM_PYTHON = (
    Path(os.environ.get("ROCMDOCTOR_TEST_CACHE", "/root/.cache/rocmdoctor-test")) / "vllm-venv/bin/python"
)


def timed(argv: list[str], runs: int) -> tuple[list[float], list[float]]:
    """Wall seconds and CPU seconds (user + system of the child) of each run."""
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        proc = subprocess.run(argv, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if proc.returncode not in (0, 1):
            sys.exit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-500:]}")
    return walls, cpus


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--vllm-runs", type=int, default=3)
    parser.add_argument("--fixture", default="strix-halo-clean")
    args = parser.parse_args()
    rocmdoctor = Path(sys.executable).parent / "rocmdoctor"
    check = [str(rocmdoctor), "--root", str(REPO / "tests/fixtures/hosts" / args.fixture), "check", "--json"]
    timed(check, 2)  # warm the page cache and .pyc files
    ours, ours_cpu = timed(check, args.runs)
    load = os.getloadavg()[0]
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, load {load:.1f}"
    )
    print(f"command: {' '.join(check)}")
    print(
        f"rocmdoctor check: median {statistics.median(ours):.3f} s wall (min {min(ours):.3f}, max {max(ours):.3f}), "
        f"median {statistics.median(ours_cpu):.3f} s CPU, over {args.runs} runs"
    )
    if args.vllm_runs < 1 or not VLLM_PYTHON.exists():
        print("vllm.collect_env: not measured, no ratio")
        return
    collect = [str(VLLM_PYTHON), "-m", "vllm.collect_env"]
    theirs, _ = timed(collect, args.vllm_runs)
    print(f"command: {' '.join(collect)}")
    print(f"vllm.collect_env: median {statistics.median(theirs):.3f} s over {args.vllm_runs} runs")
    print(f"ratio rocmdoctor/collect_env: {statistics.median(ours) / statistics.median(theirs):.3f}")


if __name__ == "__main__":
    main()
