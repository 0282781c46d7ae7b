"""`rocmdoctor bench`: against the real engine, against misbehaving servers, and its arithmetic."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import pytest
from jsonschema import validate

from harness.fake_openai import fake_server
from harness.smoke_cli import rocmdoctor, rocmdoctor_json
from rocmdoctor.provision.verify.bench import RequestResult, find_knee, percentile, summarize_level
from rocmdoctor.report import load_schema


def _bench_real_engine(engine, key_file, plot):
    return rocmdoctor_json(
        "bench",
        "--url",
        engine.base_url,
        "--api-key-file",
        str(key_file),
        "--concurrency",
        "4,16",
        "--requests",
        "32",
        "--prompt-tokens",
        "32",
        "--max-tokens",
        "128",
        "--plot",
        str(plot),
    )


def test_bench_against_the_real_engine(vllm_engine, vllm_engine_key_file, tmp_path):
    plot = tmp_path / "bench.svg"
    runs = []
    # One rerun at most: the 16-way level lasts about a second, and on a 2-core machine shared with
    # other work a single starved second can sink it. Every run must still count tokens exactly.
    for _ in range(2):
        code, report = _bench_real_engine(vllm_engine, vllm_engine_key_file, plot)
        validate(report, load_schema("bench-report.schema.json"))
        assert code == 0, report
        levels = {level["concurrency"]: level for level in report["levels"]}
        assert sorted(levels) == [1, 4, 16]  # sequential is always measured
        for level in levels.values():
            assert level["failures"] == 0 and level["output_tokens"] == 32 * 128  # ignore_eos: exact lengths
            assert level["ttft_ms"]["p50"] <= level["e2el_ms"]["p50"]
        check = report["cross_check"]
        assert check["status"] == "match"
        assert check["counted_tokens"] == check["server_tokens"] == 3 * 32 * 128
        runs.append(levels[16]["speedup"])
        if runs[-1] > 1.5:
            break
    assert max(runs) > 1.5, runs
    assert report["settings"]["prompt_kind"] == "token_ids"
    assert plot.read_text().lstrip().startswith("<?xml") and "<svg" in plot.read_text()


# vLLM's own count of prompt tokens served from its prefix cache (vllm/v1/metrics/loggers.py)
PREFIX_HITS = "vllm:prefix_cache_hits_total"


def _prefix_cache_hits(engine) -> float:
    """The engine's PREFIX_HITS now (its /metrics needs no key)."""
    with urllib.request.urlopen(engine.base_url + "/metrics", timeout=30) as answer:
        text = answer.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(PREFIX_HITS + "{")
    )


def test_a_rerun_is_not_served_from_the_prefix_cache(vllm_engine, vllm_engine_key_file):
    # 300-token prompts fill two of the CPU engine's 128-token blocks, which vLLM's prefix cache
    # keeps: a rerun of the same prompts found 96% of its prompt tokens there (docs/performance.md),
    # and measured cached prefills as TTFT. Each run's prompts carry the run's own number.
    args = ("--url", vllm_engine.base_url, "--api-key-file", str(vllm_engine_key_file))
    args += ("--concurrency", "1", "--requests", "2", "--prompt-tokens", "300", "--max-tokens", "2")
    runs = []
    for _ in range(2):
        before = _prefix_cache_hits(vllm_engine)
        code, report = rocmdoctor_json("bench", *args)
        assert code == 0, report
        runs.append((_prefix_cache_hits(vllm_engine) - before, report))
    assert [hits for hits, _ in runs] == [0, 0]  # the server's word, warm-ups included
    for _, report in runs:
        # the report says the same from the same counters, over the levels: 2 prompts of 300 looked up
        assert report["prefix_cache"] == {"hits": 0, "queries": 600, "detail": ""}


def test_latencies_follow_vllm_definitions_on_a_paced_server():
    # 20 ms between tokens: TPOT and ITL must come out near 20 ms, TTFT at least one gap.
    with fake_server("--token-delay", "0.02") as server:
        code, report = rocmdoctor_json(
            "bench",
            "--url",
            server.base_url,
            "--concurrency",
            "1,4",
            "--requests",
            "4",
            "--max-tokens",
            "6",
            "--prompt-tokens",
            "8",
        )
    assert code == 0, report
    for level in report["levels"]:
        assert 18 <= level["tpot_ms"]["p50"] <= 60
        assert 18 <= level["itl_ms"]["p50"] <= 60
        assert level["ttft_ms"]["p50"] >= 18
        assert level["e2el_ms"]["p50"] >= 6 * 18
        assert level["output_tokens"] == 4 * 6
    _sequential, concurrent = report["levels"]
    assert concurrent["speedup"] > 2  # the paced server serves streams in parallel
    assert report["cross_check"] == {
        "status": "match",
        "counted_tokens": 48,
        "server_tokens": 48,
        "detail": "",
    }
    assert report["settings"]["prompt_kind"] == "token_ids"


def test_text_output_and_png_plot(tmp_path):
    plot = tmp_path / "bench.png"
    with fake_server("--token-delay", "0.001") as server:
        result = rocmdoctor(
            "bench",
            "--url",
            server.base_url,
            "--concurrency",
            "2",
            "--requests",
            "4",
            "--max-tokens",
            "4",
            "--plot",
            str(plot),
        )
    assert result.returncode == 0, result.stderr
    assert "speedup" in result.stdout and "TTFT p50/p99" in result.stdout
    assert "token cross-check: match: counted 32" in result.stdout
    assert f"plot written to {plot}" in result.stdout
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_plot_without_matplotlib_is_refused_before_the_run(tmp_path):
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'matplotlib'\")\n")
    # A process of its own: the shadow package must be what a fresh interpreter finds first.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rocmdoctor",
            "bench",
            "--url",
            "http://127.0.0.1:9",
            "--plot",
            str(tmp_path / "b.png"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "shadow")},
    )
    assert result.returncode == 2
    assert "pip install 'rocmdoctor[plot]'" in result.stderr
    assert not (tmp_path / "b.png").exists()


def test_tokens_the_server_counted_beyond_ours_are_a_mismatch():
    with fake_server("--mode", "noisy") as server:
        code, report = rocmdoctor_json(
            "bench", "--url", server.base_url, "--concurrency", "2", "--requests", "4", "--max-tokens", "4"
        )
    check = report["cross_check"]
    assert code == 1 and report["failures"] == 0
    # 8 requests of 4 tokens measured; the other client's token per request shows up only on the server
    assert (check["status"], check["counted_tokens"], check["server_tokens"]) == ("mismatch", 32, 40)
    assert "other clients share it" in check["detail"]


def test_a_server_that_dies_mid_run_ends_the_bench_with_what_was_measured():
    # requests 1-4 are the warm-up round, 5-8 the sequential level; number 10 dies in the 4-way level
    with fake_server("--die-after", "10", "--token-delay", "0.002") as server:
        code, report = rocmdoctor_json(
            "bench", "--url", server.base_url, "--concurrency", "1,4", "--requests", "4", "--max-tokens", "8"
        )
    validate(report, load_schema("bench-report.schema.json"))
    assert code == 1
    sequential, broken = report["levels"]
    assert (
        sequential["failures"] == 0
        and broken["failures"] == 4
        and "closed the connection" in broken["errors"][0]
    )
    assert report["aborted"]["at_concurrency"] == 4
    assert report["aborted"]["kind"] == "unreachable"
    assert "the server went away" in report["aborted"]["remedy"]
    assert report["cross_check"]["status"] == "skipped"


@pytest.mark.timeout(60)
def test_a_stalled_stream_times_out():
    with fake_server("--mode", "stall") as server:
        started = time.monotonic()
        result = rocmdoctor("bench", "--url", server.base_url, "--timeout", "1", "--requests", "16")
    assert result.returncode == 1
    # the first chunk arrived, then nothing: the total deadline ends it, naming the endpoint
    assert "/v1/completions: no complete answer within 1 s" in result.stderr
    assert "raise --timeout" in result.stderr
    assert time.monotonic() - started < 15


@pytest.mark.parametrize(
    ("args", "message", "remedy"),
    [
        (("--mode", "fail-completions"), "HTTP 500", "rocmdoctor smoke"),
        (("--mode", "cut-stream"), "without `data: [DONE]`", "rocmdoctor smoke"),
        (("--served-name", "other"), "'tiny' is not served", "--model auto"),
        (("--api-key", "s3cret"), "401", "--api-key-file"),
    ],
)
def test_a_server_that_cannot_be_benchmarked_says_why(args, message, remedy):
    with fake_server(*args) as server:
        result = rocmdoctor("bench", "--url", server.base_url, "--model", "tiny", "--requests", "16")
    assert result.returncode == 1
    assert message in result.stderr and remedy in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "1,x,4"], "positive whole numbers"),
        (["--concurrency", "0,2"], "positive whole numbers"),
        (["--concurrency", "1,32", "--requests", "8"], "smaller than the largest --concurrency 32"),
        (["--plot", "/tmp/bench.pdf"], "name a .png or .svg file"),
        (["--plot", "/nonexistent-dir/bench.png"], "does not exist"),
        (["--api-key-file", "/nonexistent/key"], "no such file"),
    ],
)
def test_bad_input_is_exit_2_without_traceback(args, message):
    result = rocmdoctor("bench", *args)
    assert result.returncode == 2
    assert message in result.stderr


def test_an_unreachable_url_is_exit_2(unused_port):
    result = rocmdoctor("bench", "--url", f"http://127.0.0.1:{unused_port}")
    assert result.returncode == 2
    assert "connection refused" in result.stderr and "--url" in result.stderr


def _level(concurrency: int, tokens_per_s: float, failures: int = 0) -> dict:
    return {"concurrency": concurrency, "output_tokens_per_s": tokens_per_s, "failures": failures}


def test_the_knee_of_a_published_strix_halo_run():
    # 95.6 tok/s sequential, 299.3 tok/s concurrent (3.13x), then the 0.4x collapse past the scheduler
    levels = [_level(1, 95.6), _level(4, 240.0), _level(8, 290.0), _level(10, 299.3), _level(16, 38.2)]
    knee = find_knee(levels)
    assert knee["concurrency"] == 8  # within 10% of the best (299.3) already
    assert knee["recommended_max_num_seqs"] == 8
    assert knee["best_concurrency"] == 10 and knee["hurting_at"] == [16]
    assert "--max-num-seqs 8" in knee["advice"] and "falls at concurrency 16" in knee["advice"]


def test_a_knee_at_the_largest_level_asks_for_more_levels():
    knee = find_knee([_level(1, 100), _level(2, 190), _level(4, 350)])
    assert knee["reached_limit"] and knee["recommended_max_num_seqs"] is None
    assert "higher --concurrency" in knee["advice"]


def test_levels_with_failures_do_not_make_the_knee():
    knee = find_knee([_level(1, 100), _level(4, 300), _level(8, 500, failures=3)])
    assert knee["concurrency"] == 4


def test_percentiles_interpolate_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == pytest.approx(7.6)
    assert percentile([5.0], 99) == 5.0


def test_tpot_and_itl_use_vllm_definitions():
    ok = RequestResult(ok=True, output_tokens=5, ttft_s=0.1, e2el_s=0.5, itl_s=[0.1, 0.1, 0.2])
    failed = RequestResult(ok=False, error="boom")
    level = summarize_level(2, [ok, failed], duration_s=2.0)
    assert ok.tpot_s == pytest.approx(0.1)  # (0.5 - 0.1) / (5 - 1)
    assert level["output_tokens_per_s"] == 2.5 and level["failures"] == 1 and level["errors"] == ["boom"]
    assert level["itl_ms"]["p50"] == pytest.approx(100.0)
    assert RequestResult(ok=True, output_tokens=1, ttft_s=0.1, e2el_s=0.1).tpot_s is None


def test_prompt_tokens_served_from_the_prefix_cache_are_said_in_the_text():
    from rich.console import Console

    from rocmdoctor.commands.bench_render import render_bench
    from rocmdoctor.provision.verify.bench import BenchOptions, build_report

    ok = RequestResult(ok=True, output_tokens=4, ttft_s=0.01, e2el_s=0.04, itl_s=[0.01] * 3)
    counted = {"status": "match", "counted_tokens": 4, "server_tokens": 4, "detail": ""}
    texts = []
    for prefix in (
        {"hits": 0, "queries": 300, "detail": ""},
        {"hits": 256, "queries": 300, "detail": "another client sends the same prompts"},
        None,
    ):
        run = {"model": "tiny", "prompt_kind": "token_ids", "levels": [summarize_level(1, [ok], 0.05)]}
        run |= {"cross_check": counted, "prefix_cache": prefix, "aborted": None}
        report = build_report(BenchOptions(url="http://127.0.0.1:8000", concurrency=(1,)), run)
        assert report["prefix_cache"] == prefix
        console = Console(record=True, width=140)
        render_bench(report, console)
        texts.append(console.export_text())
    quiet, warned, unknown = texts
    assert "prefix cache" not in quiet and "prefix cache" not in unknown
    assert "prefix cache: 256 of 300 prompt tokens served from the server's cache" in warned
