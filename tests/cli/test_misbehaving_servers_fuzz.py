"""Random option values for `smoke`, `bench` and `serve` against randomly misbehaving servers.

Whatever the values and the server, the command never ends in a traceback or an "internal error",
its exit code is one the README defines, and it ends within its own deadline (a bound generous
for a loaded 2-core machine). The option names are the real ones; the values are drawn from what
each option accepts, so what is found here is a bug of the command, not of the input's check.
"""

from __future__ import annotations

import os
import string
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.fake_openai import fake_server_bundle, fake_servers, serve_argv
from harness.smoke_cli import rocmdoctor_in_process

SLACK_S = 20.0
CLIENT_MODES = (
    "ok",
    "stall",
    "noisy",
    "cut-stream",
    "fail-completions",
    "trickle-models",
    "no-done",
    "sse-comments",
    "endless-stream",
    "endless-models",
    "models-list",
    "usage-tokens-string",
    "tokens-10x",
    "metrics-nan",
    "metrics-garbage-later",
    "tokenize-object",
)
SERVE_MODES = ("completion-list", "garbage-status", "trickle-completion", "endless-health", "choice-string")

timeouts = st.floats(min_value=0.1, max_value=2.0).map(lambda t: f"{t:.3g}")
model_names = st.sampled_from(["auto", "tiny", "qwen3-4b"]) | st.text(
    alphabet=string.ascii_letters + string.digits + "-_./:[]{}\"' é", min_size=1, max_size=24
).filter(lambda s: not s.startswith("-"))


@pytest.fixture(scope="module")
def servers():
    with fake_servers({mode: ("--mode", mode) for mode in CLIENT_MODES}) as running:
        yield running


def _bench_args(draw) -> list[str]:
    levels = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    return [
        "--concurrency",
        ",".join(map(str, levels)),
        "--requests",
        str(draw(st.integers(1, 8))),
        "--prompt-tokens",
        str(draw(st.integers(1, 64))),
        "--max-tokens",
        str(draw(st.integers(2, 24))),
    ]


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_smoke_and_bench_never_crash_and_end_by_their_deadline(servers, capsys, monkeypatch, data):
    command = data.draw(st.sampled_from(["smoke", "bench"]), label="command")
    mode = data.draw(st.sampled_from(CLIENT_MODES), label="mode")
    timeout = data.draw(timeouts, label="timeout")
    url = servers[mode].base_url + data.draw(st.sampled_from(["", "/", "/v1", "/v1/"]), label="url suffix")
    args = [command, "--url", url, "--timeout", timeout, "--model", data.draw(model_names, label="model")]
    if command == "bench":
        args += _bench_args(data.draw)
    if data.draw(st.booleans(), label="json"):
        args.append("--json")
    code, out, err, elapsed = rocmdoctor_in_process(capsys, monkeypatch, *args)
    assert code in (0, 1, 2), (code, err)
    # smoke: --timeout is the whole run's; bench: each request's, and a timeout ends the run
    # after at most /v1/models, /tokenize and one level's requests.
    requests_at_most = 1 if command == "smoke" else 3
    assert elapsed < requests_at_most * float(timeout) + SLACK_S, (args, elapsed)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    mode=st.sampled_from(SERVE_MODES),
    timeout=st.floats(min_value=0.5, max_value=4.0).map(lambda t: f"{t:.3g}"),
    name=st.text(alphabet=string.ascii_lowercase + string.digits + "-_.", min_size=1, max_size=16),
)
def test_serve_never_crashes_ends_by_its_timeout_and_leaves_no_process(tmp_path_factory, mode, timeout, name):
    tmp = tmp_path_factory.mktemp("serve-fuzz")
    prefix = fake_server_bundle(tmp / "opt", "--mode", mode)
    argv = serve_argv(prefix, tmp / "serve.log", "--served-model-name", name, "--timeout", timeout)
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=float(timeout) + SLACK_S + 60)
    elapsed = time.monotonic() - started
    assert "Traceback" not in done.stderr.split("--- last lines")[0] and "internal error" not in done.stderr
    assert done.returncode in (1, 2), done.stderr
    assert elapsed < float(timeout) + SLACK_S
    pid_file = Path(prefix / "server.pid")
    if pid_file.exists() and pid_file.read_text():
        with pytest.raises(ProcessLookupError):
            os.killpg(int(pid_file.read_text()), 0)
