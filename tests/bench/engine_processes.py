"""What one start of the test engine costs with vLLM's process layouts: time to /health and the CPU time
of the server's processes (the API server, EngineCore, the worker), measured while it is up.

    .venv/bin/python tests/bench/engine_processes.py --rounds 2

The suite's engines run with VLLM_ENABLE_V1_MULTIPROCESSING=0 (harness/served_bundle.ENGINE_ENV) on
these figures; the layouts alternate within a round, so a load change hits each alike.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.engine import make_tiny_model, start_engine
from harness.served_bundle import ENGINE_CORE_ENV, ENGINE_ENV

LAYOUTS = {
    "api server + EngineCore + worker (vLLM's default)": ENGINE_CORE_ENV,
    "EngineCore in the API server (the suite's)": ENGINE_ENV,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "tiny")
        for round_ in range(args.rounds):
            for name, env in LAYOUTS.items():
                started = time.monotonic()
                with start_engine(model, env=env) as engine:
                    healthy_s = time.monotonic() - started
                    server = psutil.Process(engine.pid)
                    processes = [server, *server.children(recursive=True)]
                    cpu_s = sum(sum(p.cpu_times()[:2]) for p in processes)
                row = {
                    "round": round_,
                    "layout": name,
                    "healthy_s": round(healthy_s, 1),
                    "cpu_s": round(cpu_s, 1),
                    "processes": len(processes),
                    "load": round(os.getloadavg()[0], 1),
                }
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
