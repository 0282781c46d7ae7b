"""`rocmdoctor tune` against an exhaustive sweep of the same grid, on the real vLLM CPU engine.

Both runs are the same command with the same options, workload and per-point procedure (one server
start per setting, a warm-up round, the measured round); only `--search` differs (`adaptive`, the
default, against `exhaustive`, which measures every point as `vllm bench sweep` does). Each starts
with an empty state file, so nothing is skipped. Reported: each run's wall time and server starts, the
sweep's best throughput under the limit, and tune's choice measured by tune and by the sweep.

Target (issue 27): tune's choice >= 95% of the sweep's best throughput, in <= 1/3 of its wall time.

    .venv/bin/python tests/bench/tune_vs_sweep.py [--seqs 1:24] [--slo e2el:p95<=60s] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.bundles import vllm_test_bundle, write_pins
from harness.engine import free_port, make_tiny_model
from harness.served_bundle import ENGINE_ARGS, ENGINE_ENV, TEST_FAMILY, TEST_TAG, install_argv


def tune_argv(prefix: Path, model: Path, work: Path, search: str, options: argparse.Namespace) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rocmdoctor",
        "tune",
        "--json",
        "--search",
        search,
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
        "--kv-cache-memory",
        "1GiB",
        "--seqs",
        options.seqs,
        *(["--slo", options.slo] if options.slo else []),
        "--requests",
        str(options.requests),
        "--min-seconds",
        str(options.min_seconds),
        "--prompt-tokens",
        str(options.prompt_tokens),
        "--output-tokens",
        str(options.output_tokens),
        "--state-file",
        str(work / f"state-{search}.json"),
        "--log-dir",
        str(work / f"logs-{search}"),
        "--",
        *ENGINE_ARGS,
    ]


def run(argv: list[str]) -> tuple[dict, float]:
    started = time.monotonic()
    done = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, **ENGINE_ENV}, timeout=4 * 3600
    )
    seconds = time.monotonic() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"tune failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout), seconds


def confirm(prefix: Path, model: Path, work: Path, options: argparse.Namespace) -> None:
    seen: dict[int, list[float]] = {}
    options.seqs = options.confirm
    for repeat in range(options.repeats):
        (work / "state-exhaustive.json").unlink(missing_ok=True)  # measure afresh every time
        swept, _ = run(tune_argv(prefix, model, work, "exhaustive", options))
        for point in swept["points"]:
            seen.setdefault(point["max_num_seqs"], []).append(point["output_tokens_per_s"])
        print(
            f"repeat {repeat + 1}: {[(p['max_num_seqs'], p['output_tokens_per_s']) for p in swept['points']]}"
        )
    medians = {seqs: statistics.median(values) for seqs, values in seen.items()}
    print(json.dumps({"command": " ".join(sys.argv), "measured": seen, "medians": medians}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", default="1:24")
    parser.add_argument("--slo", default="e2el:p95<=60s")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--min-seconds", type=float, default=8.0)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--confirm",
        default=None,
        metavar="A,B",
        help="Instead: measure these max-num-seqs values again, alternately, --repeats times each (tune's "
        "choice against the sweep's best, free of the sweep's winner's curse); prints the medians.",
    )
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tune-vs-sweep-") as tmp:
        work = Path(tmp)
        built = vllm_test_bundle(work / "mirror", TEST_FAMILY, TEST_TAG)
        write_pins(work / "pins", {TEST_FAMILY: built})
        prefix = work / "opt"
        subprocess.run(install_argv(work / "mirror", work / "pins", prefix), check=True, capture_output=True)
        model = make_tiny_model(work / "tiny")
        if options.confirm:
            confirm(prefix, model, work, options)
            return
        tuned, tune_s = run(tune_argv(prefix, model, work, "adaptive", options))
        print(f"tune: {tune_s:.0f} s, {tuned['server_starts']} starts, winner {tuned['winner']}", flush=True)
        swept, sweep_s = run(tune_argv(prefix, model, work, "exhaustive", options))
    by_setting = {(p["max_num_seqs"], p["max_num_batched_tokens"]): p for p in swept["points"]}
    best = swept["winner"]
    winner = tuned["winner"]
    key = (winner["max_num_seqs"], winner["max_num_batched_tokens"]) if winner else None
    in_sweep = by_setting.get(key) if key else None
    result = {
        "command": " ".join(sys.argv),
        "machine": f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end",
        "seqs": options.seqs,
        "slo": options.slo,
        "tune": {
            "seconds": round(tune_s, 1),
            "server_starts": tuned["server_starts"],
            "points": [(p["max_num_seqs"], p["output_tokens_per_s"]) for p in tuned["points"]],
            "winner": winner,
        },
        "sweep": {
            "seconds": round(sweep_s, 1),
            "server_starts": swept["server_starts"],
            "points": [(p["max_num_seqs"], p["output_tokens_per_s"]) for p in swept["points"]],
            "winner": best,
        },
        "time_ratio": round(tune_s / sweep_s, 3),
        "choice_share_by_tune": round(winner["output_tokens_per_s"] / best["output_tokens_per_s"], 3)
        if winner and best
        else None,
        "choice_share_by_sweep": round(in_sweep["output_tokens_per_s"] / best["output_tokens_per_s"], 3)
        if in_sweep and best
        else None,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if options.out:
        options.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
