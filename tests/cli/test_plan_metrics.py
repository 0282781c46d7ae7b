"""`rocmdoctor plan --url`: a running server's memory diagnosis from /metrics, against loopback servers
that misbehave (and the shared fake OpenAI server, whose /metrics is not vLLM's KV metrics)."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import pytest

from harness.app_thread import serve_in_thread
from harness.cli import rocmdoctor
from harness.fake_openai import fake_server
from harness.release_server import LoopbackServer
from rocmdoctor.provision.verify.memory import MAX_METRICS_BYTES, MetricsError, diagnose_url


def exposition(usage: float, running: int, waiting: int, preemptions: int, queries: int, hits: int) -> str:
    labels = 'engine="0",model_name="tiny"'
    return (
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f"vllm:kv_cache_usage_perc{{{labels}}} {usage}\n"
        f"vllm:num_requests_running{{{labels}}} {running}.0\n"
        f"vllm:num_requests_waiting{{{labels}}} {waiting}.0\n"
        f"vllm:num_preemptions_total{{{labels}}} {preemptions}.0\n"
        f"vllm:prefix_cache_queries_total{{{labels}}} {queries}.0\n"
        f"vllm:prefix_cache_hits_total{{{labels}}} {hits}.0\n"
        f'vllm:cache_config_info{{block_size="16",engine="0",num_gpu_blocks="1000"}} 1.0\n'
    )


@contextmanager
def metrics_server(mode: str, pages: list[str] | None = None) -> Iterator[str]:
    state = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            if mode == "500":
                self.send_response(500)
                self.send_header("Content-Length", "5")
                self.end_headers()
                self.wfile.write(b"oops!")
                return
            if mode == "garbage":
                body = b"<html>this is not prometheus</html>\n{{{\n"
            elif mode == "huge":
                body = b"# " + b"x" * (MAX_METRICS_BYTES + 10) + b"\n"
            elif mode == "drip":
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                try:
                    for _ in range(1000):
                        self.wfile.write(b"#")
                        self.wfile.flush()
                        time.sleep(0.5)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                return
            else:
                assert pages is not None
                body = pages[min(state["n"], len(pages) - 1)].encode()
                state["n"] += 1
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass

    server = LoopbackServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    serve_in_thread(server)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return rocmdoctor(*args, root=tempfile.mkdtemp(prefix="plan-root-"))


@pytest.mark.parametrize(
    "mode, message",
    [
        ("500", "HTTP 500"),
        ("garbage", "not Prometheus text"),
        ("huge", "larger than"),
        ("drip", "did not arrive within"),
    ],
)
def test_misbehaving_metrics_are_refused_in_bounded_time(mode: str, message: str):
    with metrics_server(mode) as url:
        started = time.monotonic()
        with pytest.raises(MetricsError, match=message):
            diagnose_url(url, window_s=1, interval_s=0.2, timeout_s=2)
        assert time.monotonic() - started < 10


def test_fake_openai_server_metrics_are_not_vllm_kv_metrics():
    with fake_server() as fake:
        result = run_cli("plan", "--url", fake.base_url, "--window", "1")
    assert result.returncode == 2
    assert "has no vllm:kv_cache_usage_perc" in result.stderr and "Traceback" not in result.stderr


def test_preempting_server_gets_a_max_num_seqs_from_its_own_numbers():
    pages = [
        exposition(0.50, 8, 0, 10, 1000, 500),
        exposition(0.99, 20, 12, 10, 1500, 550),
        exposition(0.97, 18, 9, 17, 2000, 600),
    ]
    with metrics_server("pages", pages) as url:
        result = run_cli("plan", "--url", url, "--window", "3", "--json")
    assert result.returncode == 1, result.stderr  # preempting: exit 1, like a failed check
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "preempting" and doc["preemptions"] >= 7  # 17 - 10 within the window
    assert doc["kv_cache_usage_peak"] == pytest.approx(0.99) and doc["running_peak"] == 20
    # capacity 1000 blocks x 16 = 16000 tokens; 0.99 x 16000 / 20 = 792 tokens per sequence;
    # 0.9 x 16000 / 792 = 18.18 -> 18
    assert doc["changes"][0]["flag"] == "--max-num-seqs 18"
    assert doc["prefix_cache_hit_rate"] is not None and doc["prefix_cache_hit_rate"] < 0.2


@pytest.mark.parametrize("usage_peak", [0.30, 0.87, 0.9])
def test_preemptions_the_samples_did_not_see_full_still_ask_for_fewer_sequences_than_ran(usage_peak):
    """Samples a second apart can miss the moment the cache was full; the preemption counter did not."""
    pages = [exposition(usage_peak / 2, 3, 0, 4, 0, 0), exposition(usage_peak, 5, 1, 9, 0, 0)]
    with metrics_server("pages", pages) as url:
        diagnosis = diagnose_url(url, window_s=0.5, interval_s=0.2)
    assert diagnosis.verdict == "preempting" and diagnosis.running_peak == 5
    flag = diagnosis.changes[0]["flag"]
    assert flag.startswith("--max-num-seqs ") and 1 <= int(flag.split()[1]) < 5


def test_queueing_with_room_in_the_cache_says_raise_max_num_seqs():
    pages = [exposition(0.20, 10, 30, 0, 0, 0), exposition(0.25, 10, 40, 0, 0, 0)]
    with metrics_server("pages", pages) as url:
        diagnosis = diagnose_url(url, window_s=0.5, interval_s=0.2)
    assert diagnosis.verdict == "queueing" and diagnosis.waiting_peak == 40
    flag = diagnosis.changes[0]["flag"]
    assert flag.startswith("--max-num-seqs ") and int(flag.split()[1]) > 10


def test_url_and_window_are_validated():
    for args, message in [
        (["--url", "ftp://x"], "must start with http"),
        (["--url", "http://127.0.0.1:9", "--window", "0"], "--window must be"),
    ]:
        result = run_cli("plan", *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr


@pytest.mark.parametrize("value", ["+Inf", "-Inf"])
def test_infinite_metrics_are_a_clear_exit_2(value: str):
    page = exposition(0.5, 4, 0, 0, 10, 5).replace(
        "vllm:num_requests_running{", "vllm:num_requests_running_x{"
    )
    page += f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {value}\n'
    with metrics_server("pages", [page]) as url:
        result = run_cli("plan", "--url", url, "--window", "1")
    assert result.returncode == 2, result.stdout
    assert "not a finite number" in result.stderr and "Traceback" not in result.stderr


def test_nan_metrics_are_a_clear_exit_2():
    page = exposition(0.5, 4, 0, 0, 10, 5).replace("kv_cache_usage_perc{", "kv_cache_usage_perc_x{")
    page += 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} NaN\n'
    with metrics_server("pages", [page]) as url:
        result = run_cli("plan", "--url", url, "--window", "1")
    assert result.returncode == 2 and "has no vllm:kv_cache_usage_perc" in result.stderr
    assert "Traceback" not in result.stderr
