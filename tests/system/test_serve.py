"""`rocmdoctor serve` against the real vLLM CPU engine in an installed test bundle.

Three engine starts (~1 min each on 2 cores): one that becomes ready and is stopped with SIGTERM,
one with a model that is healthy but dies at the first request, one interrupted with Ctrl-C
(SIGINT) while EngineCore is loading.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from harness.engine import free_port
from harness.served_bundle import ENGINE_ARGS, ENGINE_CORE_ENV

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]


API_KEY = "serve-test-key-0123456789"


class ServeRun:
    """`rocmdoctor serve --json` as a child process, read one JSON event per line."""

    def __init__(self, prefix: Path, model: Path, tmp: Path, *extra: str) -> None:
        self.port = free_port()
        key_file = tmp / "api-key"
        key_file.write_text(API_KEY + "\n")
        self.log_file = tmp / "serve.log"
        argv = [
            sys.executable,
            "-m",
            "rocmdoctor",
            "serve",
            "--json",
            "--prefix",
            str(prefix),
            "--model",
            str(model),
            "--served-model-name",
            "tiny",
            "--port",
            str(self.port),
            "--gpu-memory-utilization",
            "0.5",
            "--max-model-len",
            "512",
            "--max-num-seqs",
            "4",
            "--api-key-file",
            str(key_file),
            "--timeout",
            "400",
            "--cache-dir",
            str(tmp / "vllm-cache"),
            "--log-file",
            str(self.log_file),
            *extra,
            "--",
            *ENGINE_ARGS,
        ]
        # A stray PYTHONPATH must not reach the bundle's interpreter.
        env = {**os.environ, **ENGINE_CORE_ENV, "PYTHONPATH": str(tmp / "shadowing-packages")}
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
        )
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.process.stdout, selectors.EVENT_READ)

    def next_event(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.selector.select(timeout=1.0):
                line = self.process.stdout.readline()
                if line:
                    return json.loads(line)
                break
        raise AssertionError(f"no event from serve within {timeout} s; stderr:\n{self.stderr()}")

    def stderr(self) -> str:
        if self.process.poll() is None:
            return "(still running)"
        return self.process.stderr.read()

    def engine_processes(self) -> list[psutil.Process]:
        """serve's children and theirs, but for its tether (`python -I -S -c`: host_processes), which
        stops them should serve be SIGKILLed and is no engine process."""
        found: list[psutil.Process] = []
        for child in psutil.Process(self.process.pid).children():
            if child.cmdline()[1:4] != ["-I", "-S", "-c"]:
                found += [child, *child.children(recursive=True)]
        return found

    def finish(self, timeout: float = 90) -> int:
        return self.process.wait(timeout)

    def stop_cleanly(self, sig: signal.Signals, engine: list[psutil.Process]) -> None:
        """The signal stops serve with exit 0, and none of the engine's processes is left."""
        self.process.send_signal(sig)
        assert self.next_event(90) == {"event": "stopped", "reason": sig.name, "leftover_pids": []}
        assert self.finish() == 0
        assert_all_gone(engine)

    def __enter__(self) -> ServeRun:
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:  # a failed assertion must not leave a server running
            self.process.kill()
            self.process.wait()


def completion(port: int, key: str | None) -> tuple[int, dict]:
    body = json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 4}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def assert_all_gone(processes: list[psutil.Process]) -> None:
    alive = [p.pid for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"engine processes left behind: {alive}"


def test_serve_installed_bundle_until_ready_then_sigterm_leaves_nothing(
    installed_prefix, tiny_model, tmp_path
):
    with ServeRun(installed_prefix, tiny_model, tmp_path) as run:
        ready = run.next_event(420)
        assert ready["event"] == "ready", ready
        assert ready["model"] == "tiny" and ready["url"] == f"http://127.0.0.1:{run.port}/v1"
        assert 0 < ready["health_seconds"] <= ready["seconds"]
        status, reply = completion(run.port, API_KEY)
        assert status == 200 and reply["choices"][0]["text"]
        assert completion(run.port, None)[0] == 401, "the key file must protect /v1"

        engine = run.engine_processes()
        server_env = engine[0].environ()
        assert server_env["PYTHONNOUSERSITE"] == "1" and "PYTHONPATH" not in server_env
        assert server_env["VLLM_CACHE_ROOT"] == str(tmp_path / "vllm-cache")
        assert server_env["VLLM_API_KEY"] == API_KEY
        assert len(engine) >= 2, "expected the API server and VLLM::EngineCore"

        run.stop_cleanly(signal.SIGTERM, engine)


def test_healthy_but_crashing_engine_is_not_ready_and_names_the_cause(
    installed_prefix, crashing_model, tmp_path
):
    with ServeRun(installed_prefix, crashing_model, tmp_path) as run:
        failed = run.next_event(420)
        assert failed["event"] == "failed" and failed["ready"] is False
        assert "/health answered 200 but a completion with 'tiny' failed" in failed["reason"]
        assert failed["cause"]["id"] == "unsupported-attention"
        assert "head_dim=16" in failed["cause"]["evidence"]
        assert failed["log_tail"]
        stopped = run.next_event(90)
        assert stopped["event"] == "stopped" and stopped["leftover_pids"] == []
        assert run.finish() == 1


def test_ctrl_c_while_engine_core_loads_leaves_no_engine(installed_prefix, tiny_model, tmp_path):
    with ServeRun(installed_prefix, tiny_model, tmp_path) as run:
        deadline = time.monotonic() + 300
        engine: list[psutil.Process] = []
        while time.monotonic() < deadline and len(engine) < 2:
            time.sleep(1)
            engine = run.engine_processes()
        assert len(engine) >= 2, "EngineCore never appeared"
        run.stop_cleanly(signal.SIGINT, engine)


def test_missing_bundle_and_busy_port_are_refused(tmp_path, tiny_model):
    base = [
        sys.executable,
        "-m",
        "rocmdoctor",
        "serve",
        "--model",
        str(tiny_model),
        "--gpu-memory-utilization",
        "0.5",
    ]
    done = subprocess.run(
        base + ["--prefix", str(tmp_path / "none")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "install a bundle first" in done.stderr

    prefix = tmp_path / "opt"
    (prefix / "current" / "bin").mkdir(parents=True)
    (prefix / "current" / "bin" / "vllm-server").write_text("#!/bin/sh\n")
    (prefix / "current" / "bin" / "vllm-server").chmod(0o755)
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run(
            base + ["--prefix", str(prefix), "--port", str(port)], capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 2 and f"port {port} on 127.0.0.1 is already in use" in done.stderr
