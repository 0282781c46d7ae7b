"""Bring one tiny model up across two nodes with the real ansible-playbook (playbooks/cluster.yml
--tags start) over real SSH, then stop it (--tags stop): two fake hosts (network namespaces, each with
its own /opt) joined by veth, the installed bundle's launcher wrapping a given vLLM interpreter.
tests/system/test_cluster_engine.py runs it on the suite's vLLM; tests/bench/engine_versions.py on the
versions the bundles ship. These hosts have no systemd, so the playbook starts what each unit runs,
detached (`cluster unit --json`: exec_start, environment, ready_gate).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness import cluster_net
from harness.bundles import write_launchers
from harness.engine import log_tail
from harness.engine import test_cache as engine_cache
from harness.fleet import PlaybookRun, SshFleet, netns_pids, run_playbook
from harness.trees import account_root

DIGEST = "sha256:" + "5" * 64


@dataclass
class BringUp:
    start: PlaybookRun
    stop: PlaybookRun | None
    startup_s: float
    logs: dict[str, Path]  # node name -> its server's log
    units: dict[str, str]  # node name -> its written unit
    head_address: str  # where the worker joined the head
    left: dict[str, list[str]]  # node name -> command lines of engine processes left after the stop

    def passed(self, task: str, node: str = "node0") -> bool:
        """Whether the last run of `task` in the start playbook was ok on `node`."""
        out = self.start.stdout
        if f"TASK [{task}" not in out:
            return False
        return f"ok: [{node}]" in out[out.rindex(f"TASK [{task}") :].split("\n\n")[0].splitlines()

    def tails(self) -> str:
        return "".join(f"\n--- {name}:\n{log_tail(path)}" for name, path in self.logs.items())


def install_test_bundle(host, python: Path, tag: str) -> None:
    """The test bundle's layout in the host's own /opt (harness.bundles.vllm_test_bundle): the
    launcher, the interpreter, and the qualification record install leaves."""
    current = host.opt / "rocmdoctor" / "current"
    write_launchers(current, python)
    record = {"tag": tag, "bundle_digest": DIGEST, "qualified": True}
    (current / ".rocmdoctor-qualification.json").write_text(json.dumps(record))


def bring_up_and_stop(name: str, workdir: Path, python: Path, model: Path, tag: str) -> BringUp:
    """`--tags start`, then (when it passed) `--tags stop`; every namespace is removed on the way out."""
    fleet = SshFleet(name, workdir / "fleet")
    net = None
    try:
        hosts = [fleet.add(f"node{i}") for i in range(2)]
        net = cluster_net.connect(name, hosts, net=89)
        for rank, host in enumerate(hosts):
            install_test_bundle(host, python, tag)
            host.hostvars.update(
                rocmdoctor_cluster_advertise=net.addresses[host.name],
                rocmdoctor_cluster_ifname=cluster_net.IFNAME,
                # the unit's account and files go into a private tree: these hosts share /etc
                rocmdoctor_target=str(account_root(workdir / f"tree{rank}")),
                rocmdoctor_detached_environment={
                    "HF_HUB_OFFLINE": "1",
                    "VLLM_CPU_KVCACHE_SPACE": "1",
                    "VLLM_CACHE_ROOT": str(engine_cache() / "vllm-cache"),
                    "VLLM_CPU_OMP_THREADS_BIND": str(rank),  # one core each: they share two
                },
            )
        inventory = fleet.write_inventory(
            workdir / "inventory.json",
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
        start = run_playbook(fleet, inventory, "--tags", "start", playbook="cluster.yml", timeout=600)
        startup_s = time.monotonic() - started
        logs = {
            h.name: h.opt / "rocmdoctor/run" / f"cluster-{r}.log"
            for h, r in zip(hosts, ("head", "worker"), strict=True)
        }
        units = {
            hosts[0].name: (Path(hosts[0].hostvars["rocmdoctor_target"]) / "etc/systemd/system/vllm.service"),
            hosts[1].name: (
                Path(hosts[1].hostvars["rocmdoctor_target"]) / "etc/systemd/system/vllm-worker.service"
            ),
        }
        stop, left = None, {}
        if start.rc == 0:
            stop = run_playbook(fleet, inventory, "--tags", "stop", playbook="cluster.yml", timeout=300)
            for host in hosts:
                pids = [p for p in netns_pids(host.netns) if p != host.sshd_pid() and not _is_ssh(p)]
                left[host.name] = [_cmdline(p) for p in pids]
        return BringUp(
            start,
            stop,
            startup_s,
            logs,
            {name: path.read_text() if path.exists() else "" for name, path in units.items()},
            net.addresses[hosts[0].name],
            left,
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
