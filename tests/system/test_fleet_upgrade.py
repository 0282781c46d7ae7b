"""playbooks/upgrade.yml run by the real ansible-playbook over three hosts (local connection, each its
own prefix and unit): check mode shows the batches and bundles and changes nothing; a bundle that
fails smoke rolls the canary back and no later batch starts; a good bundle moves every host with its
figures. The hosts' servers are the protocol double per bundle and `systemctl` is doubled
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

OLD = "vllm0.1.0-rocm7.0.0-gfx1151"
GOOD = "vllm0.2.0-rocm7.0.0-gfx1151"
BROKEN = "vllm0.3.0-rocm7.0.0-gfx1151"
PACE = ("--token-delay", "0.01")
HOSTS = ("upgrade-h1", "upgrade-h2", "upgrade-h3")  # the units' names too: unique to this module


class Fleet:
    def __init__(self, install_lab, lab: UpgradeLab, root: Path) -> None:
        self.install_lab, self.lab, self.root = install_lab, lab, root

    def prefix(self, host: str) -> Path:
        return self.root / host / "prefix"

    def current(self, host: str) -> str:
        return os.readlink(self.prefix(host) / "current").rsplit("/", 1)[-1]

    def playbook(self, tag: str, *args: str) -> subprocess.CompletedProcess:
        inventory = self.root / "inventory.json"
        venv = Path(sys.executable).parent.parent
        hosts = {
            host: {
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
                "rocmdoctor_prefix": str(self.prefix(host)),
                "rocmdoctor_venv": str(venv),
                "rocmdoctor_upgrade_units": [f"{host}={(self.lab.lab / f'{host}.url').read_text()}"],
                "rocmdoctor_upgrade_args": ["--connect-timeout", "2", "--retries", "2"],
            }
            for host in HOSTS
        }
        inventory.write_text(json.dumps({"all": {"children": {"rocmdoctor_hosts": {"hosts": hosts}}}}))
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
            for host in HOSTS:
                done = install_lab.cli(*install_lab.install_args("gfx1151")[:3], "--prefix", str(fleet.prefix(host)),
                                       "--bundles-dir", str(install_lab.pins))  # fmt: skip
                assert done.returncode == 0, done.stderr
                url = lab.start(host, free_port(), fleet.prefix(host))
                (lab.lab / f"{host}.url").write_text(url)
            yield fleet
        finally:
            lab.stop_all()


def summary(output: str) -> list[str]:
    """The batches' summary lines (results printed as JSON: one line per item, never wrapped)."""
    return [
        json.loads(line.strip().rstrip(","))
        for line in output.splitlines()
        if line.strip().startswith('"upgrade-h')
    ]


def test_check_mode_shows_the_batches_and_changes_nothing(fleet):
    done = fleet.playbook(GOOD, "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("PLAY [Upgrade the vLLM bundle, canary first]") == 2  # canary, then the rest
    lines = summary(done.stdout)
    assert lines == [f"{h}: planned {OLD} -> {GOOD}" for h in HOSTS], done.stdout
    assert all(fleet.current(h) == OLD for h in HOSTS)
    assert fleet.lab.restarts() == [f"restart {h}" for h in HOSTS]  # the fixture's starts only


def test_a_bundle_that_fails_smoke_rolls_the_canary_back_and_stops(fleet):
    done = fleet.playbook(BROKEN)
    assert done.returncode != 0
    lines = summary(done.stdout)
    assert len(lines) == 1 and lines[0].startswith(f"upgrade-h1: rolled-back {OLD} -> {BROKEN}: "), lines
    assert "upgrade-h1: smoke: " in lines[0]
    assert all(fleet.current(h) == OLD for h in HOSTS)
    assert fleet.lab.running("upgrade-h1") == OLD
    assert not any(r.endswith(("upgrade-h2", "upgrade-h3")) for r in fleet.lab.restarts()[3:])


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
