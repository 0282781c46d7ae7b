"""`rocmdoctor serve` when the server dies while loading with a GPU error, as people read it.

A GPU error cannot happen on this machine, so the bundle's `bin/vllm-server` here is a stand-in
that prints the real ROCm failure (the gfx1151 `.kpack` incident, provisioning-facts.md §2) and
exits like vLLM does; everything else (process group, log, diagnosis, text output) is real.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO
from harness.fake_openai import fake_server, fake_server_bundle, serve_argv

HIP_INVALID_IMAGE = """\
INFO Automatically detected platform rocm.
  File "/opt/rocmdoctor/current/lib/python3.12/site-packages/vllm/v1/utils.py", line 125, in __init__
torch.AcceleratorError: HIP error: hipErrorInvalidImage
"""


def stand_in_server(prefix: Path, content: str) -> Path:
    """The bundle's bin/vllm-server under `prefix`, executable, holding `content`."""
    server = prefix / "current" / "bin" / "vllm-server"
    server.parent.mkdir(parents=True)
    server.write_text(content)
    server.chmod(0o755)
    return server


def stand_in_bundle(tmp_path: Path, log_text: str, exit_code: int) -> Path:
    prefix = tmp_path / "opt"
    (tmp_path / "server-output.txt").write_text(log_text)
    stand_in_server(prefix, f"#!/bin/sh\ncat '{tmp_path / 'server-output.txt'}'\nexit {exit_code}\n")
    return prefix


def test_load_failure_prints_the_log_tail_and_the_likely_cause(tmp_path):
    prefix = stand_in_bundle(tmp_path, HIP_INVALID_IMAGE, 1)
    started = time.monotonic()
    done = subprocess.run(
        serve_argv(prefix, tmp_path / "serve.log"), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert time.monotonic() - started < 30, "an exited server must not wait for the load timeout"
    err = done.stderr
    assert "NOT READY: the server exited with status 1 while loading" in err
    assert "--- last lines of the server log ---" in err and "hipErrorInvalidImage" in err
    assert "likely cause: the bundle has no GPU code for this GPU's architecture" in err
    assert "what to do: Install the bundle built for this GPU family" in err
    assert "stopped (not ready); no server process left" in err
    assert "Traceback (most recent call last)" not in err.split("--- last lines")[0]
    assert done.stdout == ""


def test_a_server_that_cannot_be_executed_is_a_clear_error(tmp_path):
    prefix = tmp_path / "opt"
    server = stand_in_server(prefix, "no shebang, not a program\n")
    done = subprocess.run(
        serve_argv(prefix, tmp_path / "serve.log"), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert f"rocmdoctor: cannot start {server}" in done.stderr and "Exec format error" in done.stderr


# --- a server that answers the readiness test wrongly: every way out stops its process group ---

WAIT_READY = REPO / "provision" / "server" / "wait_ready.py"
READY_TIMEOUT_S = 5
# What a loaded 2-core machine may add to a deadline (interpreter start, stop): "ends", not a speed.
SLACK_S = 30

READINESS = {
    "completion-list": "the completion answer is a list, not a JSON object",
    "garbage-status": "/v1/completions: not a valid HTTP answer (BadStatusLine",
    "trickle-completion": "/v1/completions did not answer in full in the",
    "choice-string": "choices[0] of the completion answer carries no text",
    "endless-health": f"not ready after {READY_TIMEOUT_S} s",
}
# What ends each mode: the deadline (endless health), or the answer (the others), which a starved
# 2-core machine may deliver late (a fake server started after 5 s once in CI): the trickle needs the
# fake server up and answering before its deadline to say what it says, and waits for all of it (twice
# the latest start seen, and some).
READY_TIMEOUTS_S = {"endless-health": READY_TIMEOUT_S, "trickle-completion": 12}
ANSWER_TIMEOUT_S = 60


def ready_timeout(mode: str) -> int:
    return READY_TIMEOUTS_S.get(mode, ANSWER_TIMEOUT_S)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def server_pgid(prefix: Path, timeout_s: float = 60) -> int:
    """The stand-in server's pid, which is its process group (serve starts it in its own session)."""
    pid_file = prefix / "server.pid"
    deadline = time.monotonic() + timeout_s
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the stand-in server never started"
        time.sleep(0.1)
    return int(pid_file.read_text())


@pytest.mark.parametrize("mode", READINESS)
def test_a_readiness_answer_of_any_shape_is_not_ready_and_the_group_is_stopped(tmp_path, mode):
    prefix = fake_server_bundle(tmp_path / "opt", "--mode", mode)
    timeout_s = ready_timeout(mode)
    started = time.monotonic()
    done = subprocess.run(
        serve_argv(prefix, tmp_path / "serve.log", "--timeout", str(timeout_s)),
        capture_output=True,
        text=True,
        timeout=timeout_s + SLACK_S + 60,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 1, done.stderr
    assert "NOT READY: " in done.stderr and READINESS[mode] in done.stderr, done.stderr
    assert "stopped (not ready); no server process left" in done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert not group_alive(server_pgid(prefix))
    assert elapsed < timeout_s + SLACK_S  # --timeout bounds the wait, whatever the server sends


@pytest.mark.parametrize("mode", READINESS)
def test_wait_ready_under_systemd_fails_cleanly_on_any_answer(mode):
    with fake_server("--mode", mode, "--served-name", "m") as server:
        timeout_s = ready_timeout(mode)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, str(WAIT_READY), server.base_url, "m", str(timeout_s)],
            capture_output=True,
            text=True,
            timeout=timeout_s + SLACK_S,
            env={},
        )
        elapsed = time.monotonic() - started
    assert done.returncode == 1
    assert READINESS[mode] in done.stderr and "Traceback" not in done.stderr
    assert elapsed < timeout_s + SLACK_S


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["http://127.0.0.1:9", "m"],
        ["http://127.0.0.1:9", "m", "soon"],
        ["http://127.0.0.1:9", "m", "nan"],
        ["http://127.0.0.1:9", "m", "-1"],
        ["ftp://x", "m", "1"],
    ],
)
def test_wait_ready_bad_arguments_are_a_message_not_a_traceback(args):
    done = subprocess.run(
        [sys.executable, str(WAIT_READY), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"MAINPID": "not-a-pid"},
    )
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr
    assert (
        "usage: wait-ready URL MODEL TIMEOUT_S" in done.stderr
        or "not an http(s) URL" in done.stderr
        or "never answered" in done.stderr
    )


def test_an_error_of_serve_itself_after_the_spawn_stops_the_group_and_says_so(tmp_path):
    # --json to a reader that went away: writing the "ready" event fails inside serve.
    prefix = fake_server_bundle(tmp_path / "opt")
    reader, writer = os.pipe()
    os.close(reader)
    process = subprocess.Popen(
        serve_argv(prefix, tmp_path / "serve.log", "--json", "--timeout", "60"),
        stdout=writer,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(writer)
    _, err = process.communicate(timeout=60 + SLACK_S)
    assert process.returncode != 0
    assert "stopped the server after an error of rocmdoctor" in err, err
    assert not group_alive(server_pgid(prefix))


def test_a_sigkilled_serve_leaves_no_server_behind(tmp_path):
    """SIGKILL runs no handler and no `finally`: the server's tether sees serve's end and stops the group."""
    prefix = fake_server_bundle(tmp_path / "opt", "--mode", "endless-health")  # never ready
    process = subprocess.Popen(
        serve_argv(prefix, tmp_path / "serve.log", "--timeout", "300"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pgid = server_pgid(prefix)
    time.sleep(1)
    assert group_alive(pgid)
    process.kill()
    process.wait(timeout=10)
    deadline = time.monotonic() + SLACK_S
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_alive(pgid), "the server outlived a SIGKILLed serve"


def test_a_second_ctrl_c_does_not_leave_the_server_running(tmp_path):
    prefix = fake_server_bundle(tmp_path / "opt", "--mode", "endless-health")  # never ready
    process = subprocess.Popen(
        serve_argv(prefix, tmp_path / "serve.log", "--timeout", "300"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pgid = server_pgid(prefix)
    time.sleep(2)  # the readiness loop is running
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "stopped (SIGINT); no server process left" in err
    assert not group_alive(pgid)
    assert time.monotonic() - started < SLACK_S
