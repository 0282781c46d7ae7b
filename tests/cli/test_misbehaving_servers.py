"""`smoke` and `bench` against servers that misbehave at the protocol level, over real loopback HTTP.

Each class is one mechanism: answers that never finish end by the request's total deadline, answers
without end end at the endpoint's byte cap, answers of the wrong shape are a finding that names the
endpoint and the field. Every member must end in exit 1 with that finding, never a traceback or an
"internal error", and within the command's deadline (a bound generous for a loaded 2-core machine:
it says "ends", it is not a speed figure).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from harness.fake_openai import MISBEHAVIOURS, fake_servers
from harness.smoke_cli import rocmdoctor_in_process

TIMEOUT_S = 2.0
# What a loaded machine may add to a deadline: process start, a slow scheduler, the stop.
SLACK_S = 20.0

# mode -> (the smoke step that fails, what its summary must say)
SMOKE = {
    "trickle-models": ("models", "/v1/models: no complete answer within 2 s"),
    "trickle-headers": ("models", "/v1/models: no answer within 2 s"),
    "trickle-completion": ("completion", "/v1/completions: no complete answer within 2 s"),
    "keepalive-stream": ("chat-stream", "/v1/chat/completions: no complete answer within 2 s"),
    "sse-comments": ("chat-stream", "/v1/chat/completions: no complete answer within 2 s"),
    "no-done": ("chat-stream", "/v1/chat/completions: no complete answer within 2 s"),
    "endless-models": ("models", "/v1/models answered more than 4194304 bytes"),
    "endless-health": ("health", "/health answered more than 65536 bytes"),
    "endless-metrics": ("metrics", "/metrics answered more than 16777216 bytes"),
    "long-sse-line": ("chat-stream", "/v1/chat/completions answered a stream line of more than 262144 bytes"),
    "endless-stream": ("chat-stream", "/v1/chat/completions: the stream sent more than 18 chunks"),
    "models-list": ("models", "/v1/models: the answer is a list, not an object"),
    "models-null": ("models", "/v1/models: the answer is null, not an object"),
    "choices-string": ("completion", "/v1/completions: choices is a string, not a list"),
    "choices-object": ("completion", "/v1/completions: choices is an object, not a list"),
    "choice-string": ("completion", "/v1/completions: choices[0] is a string, not an object"),
    "message-string": ("chat", "/v1/chat/completions: choices[0].message is a string, not an object"),
    "usage-list": ("completion", "/v1/completions: usage is a list, not an object"),
    "usage-tokens-string": ("completion", "/v1/completions: usage.completion_tokens is a string"),
    "stream-event-list": ("chat-stream", "/v1/chat/completions: a stream event is a list, not an object"),
    "stream-event-number": ("chat-stream", "/v1/chat/completions: a stream event is a number, not an object"),
    "metrics-garbage-later": ("metrics", "/metrics: not the Prometheus text format"),
    "metrics-nan": ("metrics", "/metrics: vllm:generation_tokens_total is nan, not a count"),
    "metrics-inf": ("metrics", "/metrics: vllm:generation_tokens_total is inf, not a count"),
    "tokens-10x": ("completion", "usage.completion_tokens is 160, more than the max_tokens 16"),
    "tokens-50x": ("completion", "usage.completion_tokens is 800, more than the max_tokens 16"),
    "completion-list": ("completion", "/v1/completions: the answer is a list, not an object"),
    "garbage-status": ("completion", "/v1/completions: not a valid HTTP answer (Bad status line"),
}
# mode -> what `bench` says; the modes bench never meets (non-streamed or chat answers, /health
# while all goes well) are left out: those endpoints are smoke's.
BENCH = {
    "trickle-models": "/v1/models: no complete answer within 2 s",
    "trickle-headers": "/v1/models: no answer within 2 s",
    "keepalive-stream": "/v1/completions: no complete answer within 2 s",
    "sse-comments": "/v1/completions: no complete answer within 2 s",
    "no-done": "/v1/completions: no complete answer within 2 s",
    "endless-models": "/v1/models answered more than 4194304 bytes",
    "endless-metrics": "/metrics answered more than 16777216 bytes",
    "long-sse-line": "/v1/completions answered a stream line of more than 262144 bytes",
    "endless-stream": "/v1/completions: the stream sent more than 10 chunks for max_tokens 8",
    "models-list": "/v1/models: the answer is a list, not an object",
    "models-null": "/v1/models: the answer is null, not an object",
    "choices-string": "/v1/completions: choices of a stream event is a string, not a list",
    "choices-object": "/v1/completions: choices of a stream event is an object, not a list",
    "choice-string": "/v1/completions: choices[0] of a stream event is a string, not an object",
    "usage-list": "/v1/completions: usage of a stream event is a list, not an object",
    "usage-tokens-string": "/v1/completions: usage.completion_tokens of a stream event is a string",
    "stream-event-list": "/v1/completions: a stream event is a list, not an object",
    "stream-event-number": "/v1/completions: a stream event is a number, not an object",
    "tokenize-object": "/tokenize: tokens is an object, not a list",
    "metrics-garbage-later": "/metrics: not the Prometheus text format",
    "metrics-nan": "/metrics: vllm:generation_tokens_total is nan, not a count",
    "metrics-inf": "/metrics: vllm:generation_tokens_total is inf, not a count",
    "tokens-10x": "/v1/completions: the stream sent more than 10 chunks for max_tokens 8",
    "tokens-50x": "/v1/completions: the stream sent more than 10 chunks for max_tokens 8",
}
BENCH_ARGS = ("--requests", "4", "--concurrency", "2", "--max-tokens", "8", "--prompt-tokens", "8")


def test_every_misbehaviour_is_covered():
    assert set(SMOKE) | set(BENCH) == set(MISBEHAVIOURS)


@pytest.fixture(scope="module")
def servers():
    with fake_servers({mode: ("--mode", mode) for mode in MISBEHAVIOURS}) as running:
        yield running


@pytest.mark.parametrize("mode", SMOKE)
def test_smoke_names_the_endpoint_and_ends_by_its_deadline(servers, capsys, monkeypatch, mode):
    step_id, says = SMOKE[mode]
    code, out, _, elapsed = rocmdoctor_in_process(
        capsys, monkeypatch, "smoke", "--url", servers[mode].base_url, "--timeout", str(TIMEOUT_S), "--json"
    )
    steps = {step["id"]: step for step in json.loads(out)["steps"]}
    assert code == 1, steps
    assert steps[step_id]["status"] == "fail" and says in steps[step_id]["summary"], steps[step_id]
    assert steps[step_id]["remedy"]
    assert elapsed < TIMEOUT_S + SLACK_S
    assert servers[mode].process.poll() is None  # the server is fine: the finding is about its answer


@pytest.mark.parametrize("mode", BENCH)
def test_bench_names_the_endpoint_and_ends_by_its_deadline(servers, capsys, monkeypatch, mode):
    code, _, err, elapsed = rocmdoctor_in_process(
        capsys,
        monkeypatch,
        "bench",
        "--url",
        servers[mode].base_url,
        "--timeout",
        str(TIMEOUT_S),
        *BENCH_ARGS,
    )
    assert code == 1
    assert f"bench stopped: {BENCH[mode]}" in err or BENCH[mode] in err, err
    assert "→" in err  # with a remedy
    # every request ends by its deadline, and a deadline or a bad answer ends the run
    assert elapsed < 3 * TIMEOUT_S + SLACK_S


def peak_rss_while_running(argv: list[str], timeout_s: float) -> tuple[subprocess.CompletedProcess, int]:
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    deadline = time.monotonic() + timeout_s
    watched = psutil.Process(process.pid)
    while process.poll() is None and time.monotonic() < deadline:
        try:
            peak = max(peak, watched.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    if process.poll() is None:
        process.kill()
    out, err = process.communicate(timeout=30)
    return subprocess.CompletedProcess(argv, process.returncode, out, err), peak


# The bug this guards against took smoke to 5.4 GB in 20 s; a Python with aiohttp and rich is ~80 MB.
RSS_BOUND = 400 * 1024 * 1024


@pytest.mark.parametrize(
    ("command", "mode"),
    [
        ("smoke", "endless-models"),
        ("smoke", "sse-comments"),
        ("bench", "endless-stream"),
        ("smoke", "long-sse-line"),
    ],
)
def test_memory_stays_bounded_while_a_server_streams_without_end(servers, command, mode):
    argv = [sys.executable, "-m", "rocmdoctor", command, "--url", servers[mode].base_url, "--timeout", "3"]
    done, peak = peak_rss_while_running(argv, 3 + SLACK_S + 30)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert 0 < peak < RSS_BOUND, f"peak RSS {peak / 2**20:.0f} MiB"
