"""Time `rocmdoctor serve` to ready (health + a real completion) and to a clean stop, cold and warm.

Cold = empty VLLM_CACHE_ROOT (torch.compile/inductor artefacts built), warm = the same cache again,
eager = --enforce-eager (no compilation at all). Uses the test bundle and the tiny model, so it
measures rocmdoctor + vLLM startup, not a model's weight loading.

    .venv/bin/python tests/bench/serve_startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.bundles import vllm_test_bundle, write_pins
from harness.engine import free_port, make_tiny_model
from harness.served_bundle import ENGINE_ENV, TEST_FAMILY, TEST_TAG, install_argv


def serve_once(
    prefix: Path, model: Path, cache: Path, log: Path, extra: list[str]
) -> tuple[float, float, float]:
    argv = [
        sys.executable,
        "-m",
        "rocmdoctor",
        "serve",
        "--json",
        "--prefix",
        str(prefix),
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
        "--port",
        str(free_port()),
        "--gpu-memory-utilization",
        "0.5",
        "--max-model-len",
        "512",
        "--max-num-seqs",
        "4",
        "--cache-dir",
        str(cache),
        "--log-file",
        str(log),
        "--",
        "--load-format",
        "dummy",
        *extra,
    ]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, **ENGINE_ENV}
    )
    event = json.loads(proc.stdout.readline())
    ready_s = time.monotonic() - started
    if event["event"] != "ready":
        raise SystemExit(f"not ready: {event}")
    stopping = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    stopped = json.loads(proc.stdout.readline())
    proc.wait()
    assert stopped["leftover_pids"] == [], stopped
    # health -> ready: the first real completion after /health answered 200
    return ready_s, ready_s - event["health_seconds"], time.monotonic() - stopping


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1, help="repetitions of each mode")
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        base = Path(tmp)
        built = vllm_test_bundle(base / "mirror", TEST_FAMILY, TEST_TAG)
        write_pins(base / "pins", {TEST_FAMILY: built})
        subprocess.run(
            install_argv(base / "mirror", base / "pins", base / "opt"), check=True, capture_output=True
        )
        model = make_tiny_model(base / "tiny")
        for run in range(runs):
            cache = base / f"cache-{run}"
            for mode, extra in (("cold cache", []), ("warm cache", []), ("eager", ["--enforce-eager"])):
                ready_s, completion_s, stop_s = serve_once(
                    base / "opt", model, cache, base / f"{mode}-{run}.log", extra
                )
                print(
                    f"{mode:<11} ready {ready_s:6.1f} s (health -> completion {completion_s:4.1f} s)   "
                    f"stop {stop_s:5.1f} s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
