"""The real vLLM CPU engine serving one tiny model across two nodes (network namespaces joined by veth):
pipeline parallel 2 over Gloo, a head and a headless worker, each started from the unit
`rocmdoctor cluster unit --write` rendered for its node (its ExecStart and the environment the unit
gives it), the worker first; the head's own readiness gate (its ExecStartPost) passes only once the
worker joined; smoke passes on the head's endpoint; the group's stop ends every process of both nodes.

Not eager: with --enforce-eager vLLM 0.32's CPU runner skips its warm-up (cpu_model_runner.py
`warming_up_model` returns when compilation is off), the last pipeline stage never allocates its
intermediate tensors, and the first request fails ("assert self.intermediate_tensors is not None"
on the worker, "KeyError: 'cmpl-...'" in the head's scheduler) although /health is 200.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import cluster_net
from harness.cli import rocmdoctor
from harness.engine import engine_env, log_tail, make_tiny_model, require_vllm_python, stop_group
from harness.engine import test_cache as engine_cache
from harness.fleet import kill_netns
from harness.trees import account_root

pytestmark = pytest.mark.engine

HEAD_PORT = 8000
STARTUP_S = 420


def unit_lines(unit: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(key + "=")]


def unit_command(unit: str, tree: Path) -> tuple[list[str], dict[str, str]]:
    """The unit's ExecStart argv (a path written into the target tree read from there) and the
    variables its Environment= lines set."""
    argv = shlex.split(unit_lines(unit, "ExecStart")[0])
    argv = [
        str(tree) + word if word.startswith("/") and (tree / word.lstrip("/")).exists() else word
        for word in argv
    ]
    env: dict[str, str] = {}
    for line in unit_lines(unit, "Environment"):
        env.update(word.split("=", 1) for word in shlex.split(line))
    return argv, env


def start(node, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            ["ip", "netns", "exec", node.netns, *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def test_pipeline_parallel_across_two_nodes(tmp_path: Path):
    python = require_vllm_python()
    # one path for every run: vLLM's compile cache is keyed by it, and a warm cache saves a minute
    model = make_tiny_model(engine_cache() / "cluster-tiny-model")
    prefix = tmp_path / "prefix"
    (prefix / "current" / "bin").mkdir(parents=True)
    # the test bundle's layout (harness.bundles.vllm_test_bundle): its launcher and its interpreter
    (prefix / "current/bin/vllm-server").write_text(
        f'#!/bin/bash\nexec "{python}" -m vllm.entrypoints.openai.api_server "$@"\n'
    )
    (prefix / "current/bin/python3").write_text(f'#!/bin/bash\nexec "{python}" "$@"\n')
    for name in ("vllm-server", "python3"):
        (prefix / "current/bin" / name).chmod(0o755)
    nodes = cluster_net.bare_nodes("clue", 2)
    net = cluster_net.connect("clue", nodes, net=89)
    head_ip = net.addresses["node0"]
    running: list[subprocess.Popen] = []
    logs = [tmp_path / "head.log", tmp_path / "worker.log"]
    try:
        commands = []
        for rank, node in enumerate(nodes):
            tree = account_root(tmp_path / f"node{rank}")
            done = rocmdoctor(
                "cluster", "unit", "--write", "--target", str(tree), "--prefix", str(prefix),
                "--nnodes", "2", "--node-rank", str(rank), "--master-addr", head_ip,
                "--advertise", net.addresses[node.name], "--socket-ifname", cluster_net.IFNAME,
                "--model", str(model), "--served-model-name", "tiny", "--host", "127.0.0.1",
                "--port", str(HEAD_PORT), "--max-model-len", "512", "--gpu-memory-utilization", "0.5",
                "--", "--load-format", "dummy",
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            name = "vllm.service" if rank == 0 else "vllm-worker.service"
            unit = (tree / "etc/systemd/system" / name).read_text()
            argv, unit_env = unit_command(unit, tree)
            assert unit_env["VLLM_HOST_IP"] == net.addresses[node.name]
            assert unit_env["GLOO_SOCKET_IFNAME"] == cluster_net.IFNAME
            assert ("--headless" in argv) == (rank == 1) and "--node-rank" in argv
            # the unit's own variables, without its service-account paths (/var/lib/vllm, ...)
            keep = {k: v for k, v in unit_env.items() if not v.startswith("/")}
            # one core each: both nodes share this machine's two
            env = engine_env({**keep, "VLLM_CPU_OMP_THREADS_BIND": str(rank)})
            commands.append((argv, env, unit, tree))
        # the worker first, then the head (the playbook's order)
        for rank in (1, 0):
            argv, env, _, _ = commands[rank]
            running.append(start(nodes[rank], argv, env, logs[rank]))
        started = time.monotonic()
        head_unit, head_tree = commands[0][2], commands[0][3]
        gate = shlex.split(unit_lines(head_unit, "ExecStartPost")[0])
        gate = [
            str(head_tree) + w if w.startswith("/") and (head_tree / w.lstrip("/")).exists() else w
            for w in gate
        ]
        gate[-1] = str(STARTUP_S)
        ready = subprocess.run(
            ["ip", "netns", "exec", nodes[0].netns, *gate],
            capture_output=True,
            text=True,
            timeout=STARTUP_S + 30,
        )
        assert ready.returncode == 0, (
            ready.stdout + ready.stderr + "\nhead:\n" + log_tail(logs[0]) + "\nworker:\n" + log_tail(logs[1])
        )
        startup_s = time.monotonic() - started
        worker_log = logs[1].read_text(errors="replace")
        assert "PP rank 1" in worker_log and f"tcp://{head_ip}:29501" in worker_log, log_tail(logs[1])
        smoke = subprocess.run(
            ["ip", "netns", "exec", nodes[0].netns, sys.executable, "-m", "rocmdoctor", "smoke",
             "--url", f"http://127.0.0.1:{HEAD_PORT}", "--json"],
            capture_output=True, text=True, timeout=180,
            env={**os.environ, "ROCMDOCTOR_NO_COLOR": "1"},
        )  # fmt: skip
        assert smoke.returncode == 0, smoke.stdout[-3000:] + smoke.stderr[-3000:]
        steps = {
            step["id"]: step["status"]
            for value in json.loads(smoke.stdout).values()
            if isinstance(value, list)
            for step in value
            if isinstance(step, dict) and "status" in step
        }
        assert steps.get("completion") == "pass" and steps.get("chat") == "pass", steps
        # the group's stop (the playbook's `stop`: every node's unit, the head first): each process
        # group ends within the grace period. A worker left alone notices its head gone only after
        # vLLM's own shutdown timeout (about 90 s on this machine), so it is stopped, not awaited.
        worker, head = running
        for process in (head, worker):
            stop_group(process, process.pid)
        running.clear()
        print(f"two-node PP startup (worker and head started, readiness gate passed): {startup_s:.0f} s")
    finally:
        for process in running:
            with contextlib.suppress(RuntimeError):
                stop_group(process, process.pid)
        net.close()
        for node in nodes:
            kill_netns(node.netns)
