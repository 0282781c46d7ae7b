"""How long the test engine takes from launch to /health 200, eager or with torch.compile.

    .venv/bin/python tests/bench/bench_engine_startup.py [--compile] [--runs 1]

Starts `harness.engine.start_engine` on the tiny model, sends three 128-token completions, stops it
and prints the times as JSON. With --compile the torch.compile cache lives in the test cache
(VLLM_CACHE_ROOT), so only the first such start on a machine is cold. Figures: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.engine import make_tiny_model, start_engine


def completion_s(base_url: str, model: str) -> float:
    body = json.dumps({"model": model, "prompt": "hello", "max_tokens": 128, "ignore_eos": True}).encode()
    request = urllib.request.Request(
        f"{base_url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as response:
        assert json.load(response)["usage"]["completion_tokens"] == 128
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile", action="store_true", help="torch.compile instead of --enforce-eager")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="smoke-startup-") as scratch:
        model = make_tiny_model(Path(scratch) / "model")
        for _ in range(args.runs):
            load_before = os.getloadavg()[0]
            started = time.monotonic()
            with start_engine(
                model, enforce_eager=not args.compile, log_path=Path(scratch) / "vllm.log"
            ) as engine:
                requests_s = [round(completion_s(engine.base_url, engine.model), 3) for _ in range(3)]
                stopping = time.monotonic()
            result = {
                "mode": "compile" if args.compile else "eager",
                "healthy_after_s": round(engine.startup_s, 1),
                "completion_128_tokens_s": requests_s,
                "stop_s": round(time.monotonic() - stopping, 2),
                "total_s": round(time.monotonic() - started, 1),
                "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            }
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
