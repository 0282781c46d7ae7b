"""What the context probe costs on the real CPU engine, and that it passes there at every length.

Starts the tiny Llama with seeded random weights (harness.weighted_model) at max_model_len 512,
runs `rocmdoctor smoke --context-probe on` --runs times and prints, per run, the ladder, the longest
consistent length, requests, prompt and generated tokens and seconds (the probe's own figure).

    .venv/bin/python tests/bench/context_probe_cost.py [--runs 3]

Run from the repository root with ROCMDOCTOR_TEST_CACHE set as for the tests. Figures:
docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.engine import start_engine
from harness.weighted_model import LOAD_REAL_WEIGHTS, make_weighted_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = make_weighted_tiny_model(Path(tmp) / "model")
        with start_engine(model, extra_args=LOAD_REAL_WEIGHTS) as engine:
            for run in range(args.runs):
                argv = [sys.executable, "-m", "rocmdoctor", "smoke", "--url", engine.base_url]
                argv += ["--context-probe", "on", "--timeout", "120", "--json"]
                report = json.loads(subprocess.run(argv, capture_output=True, text=True).stdout)
                step = next(s for s in report["steps"] if s["id"] == "context")
                details = step["details"]
                consistency = details["consistency"]
                print(
                    f"run {run + 1}: {step['status']} ladder {details['ladder']} "
                    f"longest consistent {consistency['longest_consistent']} "
                    f"verdicts {sorted({c['verdict'] for c in consistency['checks']})} "
                    f"needle {details['needle']['verdict']} cost {json.dumps(details['cost'])} "
                    f"step {step['elapsed_s']:.2f} s"
                )


if __name__ == "__main__":
    main()
