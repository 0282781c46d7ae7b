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

import json
import sys
import time
from pathlib import Path

import pytest

from harness import cluster_net
from harness.engine import log_tail, make_tiny_model, require_vllm_python
from harness.engine import test_cache as engine_cache
from harness.fleet import SshFleet, netns_pids, run_playbook
from harness.trees import account_root

pytestmark = [pytest.mark.engine, pytest.mark.ssh]

DIGEST = "sha256:" + "5" * 64


def install_test_bundle(host, python: Path) -> None:
    """The test bundle's layout in the host's own /opt (harness.bundles.vllm_test_bundle): the
    launcher, the interpreter, and the qualification record install leaves."""
    current = host.opt / "rocmdoctor" / "current"
    (current / "bin").mkdir(parents=True, exist_ok=True)
    (current / "bin/vllm-server").write_text(
        f'#!/bin/bash\nexec "{python}" -m vllm.entrypoints.openai.api_server "$@"\n'
    )
    (current / "bin/python3").write_text(f'#!/bin/bash\nexec "{python}" "$@"\n')
    for name in ("vllm-server", "python3"):
        (current / "bin" / name).chmod(0o755)
    record = {"tag": "vllm0.32.0-cpu-test", "bundle_digest": DIGEST, "qualified": True}
    (current / ".rocmdoctor-qualification.json").write_text(json.dumps(record))


def test_pipeline_parallel_across_two_nodes_by_the_playbook(tmp_path: Path):
    python = require_vllm_python()
    # one path for every run: vLLM's compile cache is keyed by it, and a warm cache saves a minute
    model = make_tiny_model(engine_cache() / "cluster-tiny-model")
    fleet = SshFleet("clue", tmp_path / "fleet")
    net = None
    try:
        hosts = [fleet.add(f"node{i}") for i in range(2)]
        net = cluster_net.connect("clue", hosts, net=89)
        for rank, host in enumerate(hosts):
            install_test_bundle(host, python)
            host.hostvars.update(
                rocmdoctor_cluster_advertise=net.addresses[host.name],
                rocmdoctor_cluster_ifname=cluster_net.IFNAME,
                # the unit's account and files go into a private tree: these hosts share /etc
                rocmdoctor_target=str(account_root(tmp_path / f"tree{rank}")),
                rocmdoctor_detached_environment={
                    "HF_HUB_OFFLINE": "1",
                    "VLLM_CPU_KVCACHE_SPACE": "1",
                    "VLLM_CACHE_ROOT": str(engine_cache() / "vllm-cache"),
                    "VLLM_CPU_OMP_THREADS_BIND": str(rank),  # one core each: they share two
                },
            )
        inventory = fleet.write_inventory(
            tmp_path / "inventory.json",
            group="rocmdoctor_cluster",
            group_vars={
                "rocmdoctor_cluster_cli": [sys.executable, "-m", "rocmdoctor"],
                "rocmdoctor_cluster_model": str(model),
                "rocmdoctor_prefix": "/opt/rocmdoctor",
                "rocmdoctor_cluster_listen_s": 5,
                "rocmdoctor_detached_server": True,
                "rocmdoctor_cluster_server_args": [
                    "--served-model-name",
                    "tiny",
                    "--host",
                    "127.0.0.1",
                    "--max-model-len",
                    "512",
                    "--gpu-memory-utilization",
                    "0.5",
                    "--timeout",
                    "420",
                    "--",
                    "--load-format",
                    "dummy",
                ],
            },  # fmt: skip
        )
        started = time.monotonic()
        run = run_playbook(fleet, inventory, "--tags", "start", playbook="cluster.yml", timeout=600)
        startup_s = time.monotonic() - started
        logs = {
            h.name: h.opt / "rocmdoctor/run" / f"cluster-{r}.log"
            for h, r in zip(hosts, ("head", "worker"), strict=True)
        }
        tails = "".join(f"\n--- {name}:\n{log_tail(path)}" for name, path in logs.items())
        assert run.rc == 0, run.stdout[-6000:] + run.stderr[-2000:] + tails
        assert "cluster pre-flight ok: 2 nodes, head node0, 2 of 2 connections" in run.stdout
        # the head's own gate passed on the head, then smoke on its endpoint (the last run of each task)
        for task in ("Pass the head's readiness gate", "Smoke on the head's endpoint"):
            after = run.stdout[run.stdout.rindex(f"TASK [{task}") :]
            assert "ok: [node0]" in after.split("\n\n")[0].splitlines(), after[:800]
        worker_log = logs["node1"].read_text(errors="replace")
        assert "PP rank 1" in worker_log and f"tcp://{net.addresses['node0']}:29501" in worker_log
        assert "backend=gloo" in worker_log
        head_unit = Path(hosts[0].hostvars["rocmdoctor_target"]) / "etc/systemd/system/vllm.service"
        worker_unit = Path(hosts[1].hostvars["rocmdoctor_target"]) / "etc/systemd/system/vllm-worker.service"
        assert "--node-rank 0" in head_unit.read_text() and "--headless" in worker_unit.read_text()
        recap = run.recap()
        assert recap["node0"]["failed"] == 0 and recap["node1"]["failed"] == 0, recap

        stop = run_playbook(fleet, inventory, "--tags", "stop", playbook="cluster.yml", timeout=300)
        assert stop.rc == 0, stop.stdout[-4000:]
        assert stop.recap()["node0"]["changed"] == 1 and stop.recap()["node1"]["changed"] == 1, stop.stdout
        for host in hosts:
            left = [p for p in netns_pids(host.netns) if p != host.sshd_pid()]
            engine = [p for p in left if not _is_ssh(p)]
            task = stop.stdout[stop.stdout.index("TASK [Stop the detached") :]
            assert not engine, (host.name, [_cmdline(p) for p in engine], task)
        print(
            f"playbook --tags start on two nodes (pre-flight, units, worker, head gate, smoke): {startup_s:.0f} s"
        )
    finally:
        if net is not None:
            net.close()
        fleet.close()


def _is_ssh(pid: int) -> bool:
    try:
        # sshd's sessions, and the ProxyCommand (`nc`) of the controller's persisted SSH connections
        return Path(f"/proc/{pid}/comm").read_text().strip() in ("sshd", "sshd-session", "nc")
    except OSError:
        return True  # gone meanwhile


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "(gone)"
