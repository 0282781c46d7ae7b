"""playbooks/upgrade.yml run by the real ansible-playbook over three hosts (local connection, each its
own prefix and unit): check mode shows the batches and bundles and changes nothing; a bundle that
fails smoke rolls the canary back and no later batch starts; a good bundle moves every host with its
figures; a multi-node group (head and worker, group rocmdoctor_cluster) moves as one unit or not at
all. The hosts' servers are the protocol double per bundle and `systemctl` is doubled
(harness/upgrade_lab.py): the playbook's batching, stop and summary are the point here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import rocmdoctor
from harness.engine import free_port
from harness.fleet import ANSIBLE_PLAYBOOK, PLAYBOOKS
from harness.upgrade_lab import UpgradeLab, server_script
from rocmdoctor.provision.server.cluster_unit import WORKER_UNIT

OLD = "vllm0.1.0-rocm7.0.0-gfx1151"
GOOD = "vllm0.2.0-rocm7.0.0-gfx1151"
BROKEN = "vllm0.3.0-rocm7.0.0-gfx1151"
PACE = ("--token-delay", "0.01")
HOSTS = ("upgrade-h1", "upgrade-h2", "upgrade-h3")  # the units' names too: unique to this module
# A multi-node group (cluster.yml's layout): the head's unit and a worker's (cluster_unit's names).
GROUP = {"upgrade-head": "vllm", "upgrade-worker": WORKER_UNIT.removesuffix(".service")}


class Fleet:
    def __init__(self, install_lab, lab: UpgradeLab, root: Path) -> None:
        self.install_lab, self.lab, self.root = install_lab, lab, root

    def prefix(self, host: str) -> Path:
        return self.root / host / "prefix"

    def current(self, host: str) -> str:
        return os.readlink(self.prefix(host) / "current").rsplit("/", 1)[-1]

    def hostvars(self, host: str, unit: str) -> dict:
        return {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "rocmdoctor_prefix": str(self.prefix(host)),
            "rocmdoctor_venv": str(Path(sys.executable).parent.parent),
            "rocmdoctor_upgrade_units": [f"{unit}={(self.lab.lab / f'{unit}.url').read_text()}"],
            "rocmdoctor_upgrade_args": ["--connect-timeout", "2", "--retries", "2"],
        }

    def playbook(
        self, tag: str, *args: str, group: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        """upgrade.yml over HOSTS, or over the multi-node `group` alone (node -> its unit)."""
        inventory = self.root / "inventory.json"
        if group is None:
            children = {"rocmdoctor_hosts": {"hosts": {host: self.hostvars(host, host) for host in HOSTS}}}
        else:
            nodes = {node: self.hostvars(node, unit) for node, unit in group.items()}
            children = {"rocmdoctor_hosts": {"hosts": nodes}, "rocmdoctor_cluster": {"hosts": nodes}}
        inventory.write_text(json.dumps({"all": {"children": children}}))
        return subprocess.run(
            [
                str(ANSIBLE_PLAYBOOK),
                "-i",
                str(inventory),
                "upgrade.yml",
                "-e",
                f"rocmdoctor_upgrade_tag={tag}",
            ]
            + ["-e", "rocmdoctor_upgrade_batch_percent=100", *args],
            cwd=PLAYBOOKS,
            env={
                **os.environ,
                **self.lab.env(),
                "ROCMDOCTOR_GITHUB_API": self.install_lab.server.api_url,
                "ANSIBLE_LOCAL_TEMP": str(self.root / "ansible-tmp"),
                "ANSIBLE_NOCOLOR": "1",
                "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
            },
            capture_output=True,
            text=True,
            timeout=600,
        )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    from harness.release_server import ReleaseServer
    from plugins.install import InstallLab

    root = tmp_path_factory.mktemp("fleet-upgrade")
    with ReleaseServer() as server:
        install_lab = InstallLab(root, server)
        install_lab.pin(
            "gfx1151", install_lab.bundle(OLD, {"bin/vllm-server": (server_script(*PACE), 0o755)})
        )
        install_lab.bundle(GOOD, {"bin/vllm-server": (server_script(*PACE), 0o755)})
        install_lab.bundle(BROKEN, {"bin/vllm-server": (server_script("--mode", "fail-completions"), 0o755)})
        lab = UpgradeLab(root / "lab", root / "unused")
        fleet = Fleet(install_lab, lab, root)
        try:
            for host, unit in [*((h, h) for h in HOSTS), *GROUP.items()]:
                done = install_lab.cli(*install_lab.install_args("gfx1151")[:3], "--prefix", str(fleet.prefix(host)),
                                       "--bundles-dir", str(install_lab.pins))  # fmt: skip
                assert done.returncode == 0, done.stderr
                url = lab.start(unit, free_port(), fleet.prefix(host))
                (lab.lab / f"{unit}.url").write_text(url)
            yield fleet
        finally:
            lab.stop_all()


def summary(output: str) -> list[str]:
    """The batches' summary lines (results printed as JSON: one line per item, never wrapped)."""
    return [
        json.loads(line.strip().rstrip(","))
        for line in output.splitlines()
        if line.strip().startswith(('"upgrade-h', '"upgrade-w'))
    ]


def test_check_mode_shows_the_batches_and_changes_nothing(fleet):
    done = fleet.playbook(GOOD, "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PLAY [Upgrade the vLLM bundle, canary first]") == 2  # canary, then the rest
    lines = summary(done.stdout)
    assert lines == [f"{h}: planned {OLD} -> {GOOD}" for h in HOSTS], done.stdout
    assert all(fleet.current(h) == OLD for h in HOSTS)
    assert fleet.lab.restarts() == [f"restart {u}" for u in (*HOSTS, *GROUP.values())]  # the fixture's


def test_a_bundle_that_fails_smoke_rolls_the_canary_back_and_stops(fleet):
    done = fleet.playbook(BROKEN)
    assert done.returncode != 0
    lines = summary(done.stdout)
    assert len(lines) == 1 and lines[0].startswith(f"upgrade-h1: rolled-back {OLD} -> {BROKEN}: "), lines
    assert "upgrade-h1: smoke: " in lines[0]
    assert all(fleet.current(h) == OLD for h in HOSTS)
    assert fleet.lab.running("upgrade-h1") == OLD
    assert not any(r.endswith(("upgrade-h2", "upgrade-h3")) for r in fleet.lab.restarts()[5:])


def test_a_good_bundle_moves_every_host_with_its_figures(fleet):
    # loose: a good bundle moves whatever the shared machine's load does to one measurement
    done = fleet.playbook(GOOD, "-e", "rocmdoctor_upgrade_max_regression=400")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = summary(done.stdout)
    assert [line.split(" (")[0] for line in lines] == [f"{h}: moved {OLD} -> {GOOD}" for h in HOSTS]
    assert all("% tok/s" in line for line in lines)
    assert all(fleet.current(h) == GOOD and fleet.lab.running(h) == GOOD for h in HOSTS)
    again = rocmdoctor(
        "upgrade", "--tag", GOOD, "--prefix", str(fleet.prefix("upgrade-h1")), "--json",
        "--unit", f"upgrade-h1={(fleet.lab.lab / 'upgrade-h1.url').read_text()}",
        env={"ROCMDOCTOR_GITHUB_API": fleet.install_lab.server.api_url, **fleet.lab.env()},
    )  # fmt: skip
    assert json.loads(again.stdout)["changed"] is False


def test_a_multi_node_group_moves_as_one_unit_or_not_at_all(fleet):
    """The head is gated on smoke and bench, a worker on readiness (--ready-only): BROKEN passes the
    worker's gate and fails the head's smoke, so the worker is switched back and every node restarts
    on the old bundle; GOOD moves both."""
    worker = GROUP["upgrade-worker"]
    done = fleet.playbook(BROKEN, group=GROUP)
    (fleet.root / "group-broken.log").write_text(done.stdout)
    assert done.returncode != 0
    assert "PLAY [Upgrade the multi-node group as one unit]" in done.stdout
    lines = summary(done.stdout)
    assert f"upgrade-worker: moved {OLD} -> {BROKEN}" in lines, done.stdout[-6000:]
    assert any(
        line.startswith(f"upgrade-head: rolled-back {OLD} -> {BROKEN}: vllm: smoke: ") for line in lines
    )
    assert "stays on its bundle" in done.stdout
    assert all(fleet.current(node) == OLD for node in GROUP)
    assert fleet.lab.running("vllm") == OLD and fleet.lab.running(worker) == OLD
    restarts = fleet.lab.restarts()
    assert restarts.count(f"restart {worker}") == 3  # start, on BROKEN, back on OLD with the group

    done = fleet.playbook(GOOD, "-e", "rocmdoctor_upgrade_max_regression=400", group=GROUP)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr
    lines = summary(done.stdout)
    assert sorted(line.split(" (")[0] for line in lines) == [
        f"upgrade-head: moved {OLD} -> {GOOD}",
        f"upgrade-worker: moved {OLD} -> {GOOD}",
    ]
    assert all(fleet.current(node) == GOOD for node in GROUP)
    assert fleet.lab.running("vllm") == GOOD and fleet.lab.running(worker) == GOOD
