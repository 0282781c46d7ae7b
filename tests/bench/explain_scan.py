"""Wall time, CPU time and peak memory of `rocmdoctor explain` on logs built here: a 64 MiB vLLM-like log
(16 MiB of it is read), a sparse 2 GB file (NULs, the cause on its last line; no 2 GB on disk), 16 MiB of
hostile 4 KiB lines made to make regexes backtrack, and one corpus log.

    .venv/bin/python tests/bench/explain_scan.py [--runs 3]
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "tests/fixtures/hosts/no-amd-gpu"
LINES = [
    b"(EngineCore_DP0 pid=742) INFO 11-12 11:11:48 [gpu_model_runner.py:1892] Model loading took 1.12 GiB\n",
    b"INFO 07-28 23:02:27 [kv_cache_utils.py:833] GPU KV cache size: 176,240 tokens\n",
    b'Aug 19 18:34:30 vllm vllm[8707]: (APIServer pid=8707)   File "/opt/vllm/lib/python3.12/site-packages/'
    b'vllm/v1/engine/async_llm.py", line 220, in from_vllm_config\n',
]


def build(folder: Path) -> dict[str, Path]:
    logs = {
        "vllm-64MiB": folder / "vllm.log",
        "sparse-2GB": folder / "sparse.log",
        "hostile-16MiB": folder / "hostile.log",
    }
    block = b"".join(LINES) * 1000
    with logs["vllm-64MiB"].open("wb") as f:
        for _ in range(64 * 1024 * 1024 // len(block) + 1):
            f.write(block)
    with logs["sparse-2GB"].open("wb") as f:
        f.truncate(2 * 1024**3)
        f.seek(2 * 1024**3)
        f.write(b"\nOSError: [Errno 98] Address already in use\n")
    logs["hostile-16MiB"].write_bytes((b"a." * 2100 + b"\n") * 4000)
    logs["corpus"] = REPO / "tests/fixtures/logs/vllm-rocm-5-oom.log"
    return logs


def run(log: Path) -> tuple[float, float, int]:
    argv = [sys.executable, "-m", "rocmdoctor", "--root", str(ROOT), "explain", "--json", str(log)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        sys.exit(f"explain {log} exited {done.returncode}: {done.stderr[-500:]!r}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, after.ru_maxrss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    print(f"{platform.node()} {platform.processor() or platform.machine()}, {runs} runs, median")
    with tempfile.TemporaryDirectory() as tmp:
        for name, log in build(Path(tmp)).items():
            rows = [run(log) for _ in range(runs)]
            wall = statistics.median(r[0] for r in rows)
            cpu = statistics.median(r[1] for r in rows)
            print(
                f"{name:15} wall {wall:6.2f} s  cpu {cpu:6.2f} s  peak RSS (any child so far) {rows[-1][2] // 1024} MiB"
            )


if __name__ == "__main__":
    main()
