"""Wall time of `rocmdoctor check --json --root <fixture>` as whole processes, against
`python -m vllm.collect_env` (vLLM's own environment report) where vLLM is installed.

    .venv/bin/python tests/bench/check_speed.py [--runs 20] [--vllm-runs 3] [--fixture strix-halo-clean]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = (
    Path(os.environ.get("ROCMDOCTOR_TEST_CACHE", "/root/.cache/rocmdoctor-test")) / "vllm-venv/bin/python"
)


def timed(argv: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        proc = subprocess.run(argv, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - started)
        if proc.returncode not in (0, 1):
            sys.exit(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-500:]}")
    return times


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
    ours = timed(check, args.runs)
    print(
        f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(f"command: {' '.join(check)}")
    print(
        f"rocmdoctor check: median {statistics.median(ours):.3f} s, min {min(ours):.3f} s, "
        f"max {max(ours):.3f} s over {args.runs} runs"
    )
    if not VLLM_PYTHON.exists():
        print(f"vllm.collect_env: {VLLM_PYTHON} not found, no ratio")
        return
    collect = [str(VLLM_PYTHON), "-m", "vllm.collect_env"]
    theirs = timed(collect, args.vllm_runs)
    print(f"command: {' '.join(collect)}")
    print(f"vllm.collect_env: median {statistics.median(theirs):.3f} s over {args.vllm_runs} runs")
    print(f"ratio rocmdoctor/collect_env: {statistics.median(ours) / statistics.median(theirs):.3f}")


if __name__ == "__main__":
    main()
