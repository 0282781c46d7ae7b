"""The real vLLM CPU engine serving one tiny model across two nodes, brought up by the real
ansible-playbook (playbooks/cluster.yml --tags start) over real SSH: two fake hosts (network
namespaces, each with its own /opt) joined by veth; the pre-flight passes; each node's units are
written by `rocmdoctor cluster unit`; the worker starts first, then the head, whose own readiness
gate (the unit's ExecStartPost, a real completion) passes only once the worker joined; smoke passes
on the head's endpoint; `--tags stop` ends every process of both nodes. Pipeline parallel 2 over
Gloo. These hosts have no systemd, so the playbook starts what each unit runs, detached
(`cluster unit --json`: exec_start, environment, ready_gate).

Not eager: with --enforce-eager vLLM 0.32's CPU runner skips its warm-up (cpu_model_runner.py
`warming_up_model` returns when compilation is off), the last pipeline stage never allocates its
intermediate tensors, and the first request fails ("assert self.intermediate_tensors is not None"
on the worker, "KeyError: 'cmpl-...'" in the head's scheduler) although /health is 200.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cluster_bringup import bring_up_and_stop
from harness.engine import make_tiny_model, require_vllm_python
from harness.engine import test_cache as engine_cache

pytestmark = [pytest.mark.engine, pytest.mark.ssh]


def test_pipeline_parallel_across_two_nodes_by_the_playbook(tmp_path: Path):
    python = require_vllm_python()
    # one path for every run: vLLM's compile cache is keyed by it, and a warm cache saves a minute
    model = make_tiny_model(engine_cache() / "cluster-tiny-model")
    done = bring_up_and_stop("clue", tmp_path, python, model, "vllm0.32.0-cpu-test")
    run = done.start
    assert run.rc == 0, run.stdout[-6000:] + run.stderr[-2000:] + done.tails()
    assert "cluster pre-flight ok: 2 nodes, head node0, 2 of 2 connections" in run.stdout
    # the head's own gate passed on the head, then smoke on its endpoint (the last run of each task)
    for task in ("Pass the head's readiness gate", "Smoke on the head's endpoint"):
        assert done.passed(task), run.stdout[-4000:]
    worker_log = done.logs["node1"].read_text(errors="replace")
    assert "PP rank 1" in worker_log and f"tcp://{done.head_address}:29501" in worker_log
    assert "backend=gloo" in worker_log
    assert "--node-rank 0" in done.units["node0"] and "--headless" in done.units["node1"]
    recap = run.recap()
    assert recap["node0"]["failed"] == 0 and recap["node1"]["failed"] == 0, recap

    stop = done.stop
    assert stop is not None and stop.rc == 0, stop.stdout[-4000:] if stop else ""
    assert stop.recap()["node0"]["changed"] == 1 and stop.recap()["node1"]["changed"] == 1, stop.stdout
    task = stop.stdout[stop.stdout.index("TASK [Stop the detached") :]
    assert all(not left for left in done.left.values()), (done.left, task)
    print(
        f"playbook --tags start on two nodes (pre-flight, units, worker, head gate, smoke): {done.startup_s:.0f} s"
    )
