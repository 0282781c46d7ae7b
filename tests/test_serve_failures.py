"""`rocmdoctor serve` when the server dies while loading with a GPU error, as people read it.

A GPU error cannot happen on this machine, so the bundle's `bin/vllm-server` here is a stand-in
that prints the real ROCm failure (the gfx1151 `.kpack` incident, provisioning-facts.md §2) and
exits like vLLM does; everything else (process group, log, diagnosis, text output) is real.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from harness.engine import free_port

HIP_INVALID_IMAGE = """\
INFO Automatically detected platform rocm.
  File "/opt/rocmdoctor/current/lib/python3.12/site-packages/vllm/v1/utils.py", line 125, in __init__
torch.AcceleratorError: HIP error: hipErrorInvalidImage
"""


def stand_in_bundle(tmp_path: Path, log_text: str, exit_code: int) -> Path:
    prefix = tmp_path / "opt"
    server = prefix / "current" / "bin" / "vllm-server"
    server.parent.mkdir(parents=True)
    (tmp_path / "server-output.txt").write_text(log_text)
    server.write_text(f"#!/bin/sh\ncat '{tmp_path / 'server-output.txt'}'\nexit {exit_code}\n")
    server.chmod(0o755)
    return prefix


def test_load_failure_prints_the_log_tail_and_the_likely_cause(tmp_path):
    prefix = stand_in_bundle(tmp_path, HIP_INVALID_IMAGE, 1)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rocmdoctor", "serve", "--prefix", str(prefix), "--model", "m",
                           "--gpu-memory-utilization", "0.5", "--port", str(free_port()),
                           "--log-file", str(tmp_path / "serve.log")],
                          capture_output=True, text=True, timeout=60)
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
    server = prefix / "current" / "bin" / "vllm-server"
    server.parent.mkdir(parents=True)
    server.write_text("no shebang, not a program\n")
    server.chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "rocmdoctor", "serve", "--prefix", str(prefix), "--model", "m",
                           "--gpu-memory-utilization", "0.5", "--port", str(free_port()),
                           "--log-file", str(tmp_path / "serve.log")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"rocmdoctor: cannot start {server}" in done.stderr and "Exec format error" in done.stderr
