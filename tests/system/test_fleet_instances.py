"""site.yml converging a host to a two-instance layout (`rocmdoctor_instances: per-partition`, two
compute partitions of the captured MI308X CPX node) under a real systemd (a systemd-nspawn container
reached over real SSH): the service phase writes vllm@.service, vllm.target and one env file per
instance through the role's module, starts the target, waits on each instance's port, and the smoke
phase tests each instance. A second run changes nothing and restarts nothing; `--check --diff` on the
converged host reports nothing; `--check --diff` with another layout shows the diffs and writes nothing.

The container has no GPU: the layout is computed for the MI308X capture (`--devices-from`, through
rocmdoctor_instances_args), and the server in each instance is harness/instance_server.py (vLLM's
OpenAI protocol on the instance's --port, recording its argv and device environment), put in by a
test-only drop-in that replaces ExecStart only: the template's readiness gate, env files and
hardening are the product's. Two real CPU engines at once do not fit the 2-core test machine; the
real engine under the fleet is covered by test_fleet.py and test_fleet_systemd.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import REPO
from harness.engine import vllm_python
from harness.fleet import SshFleet, run_playbook
from harness.hosts import fixture_root
from harness.nspawn import Bind
from harness.systemd_fleet import NO_GPU_CHECKS, ssh_systemd_host

pytestmark = [pytest.mark.ssh, pytest.mark.nspawn, pytest.mark.timeout(1500)]

NAME = "fleet-rack"
MODEL = "/srv/models/tiny"
VENV_PYTHON = Path(sys.executable)
VLLM_VENV = vllm_python().parent.parent
# two instances of one compute partition each (the capture's single-GPU fixtures give no two)
LAYOUT_ARGS = ["--devices-from", str(fixture_root("mi308x-cpx")), "--count", "2"]
ENV_DIR = "/etc/rocmdoctor/vllm"


def dropin() -> str:
    # ${ROCMDOCTOR_PORT} comes from the instance's env file, as in the product's ExecStart.
    return (
        "[Service]\nProtectHome=tmpfs\n"
        f"BindReadOnlyPaths={Path(sys.base_prefix)} {VLLM_VENV} {REPO}\n"
        f"WorkingDirectory={REPO / 'tests'}\n"
        "ExecStart=\n"
        f"ExecStart={VENV_PYTHON} -m harness.instance_server --port ${{ROCMDOCTOR_PORT}} "
        "--served-model-name tiny --tensor-parallel-size ${ROCMDOCTOR_TENSOR_PARALLEL_SIZE}\n"
    )


@pytest.fixture(scope="module")
def rack_host(tmp_path_factory, tiny_model):
    tiny_model.chmod(0o755)
    workdir = tmp_path_factory.mktemp("fleet-rack")
    binds = [
        Bind(str(Path(sys.base_prefix))),
        Bind(str(VLLM_VENV)),
        Bind(str(REPO)),
        Bind(str(tiny_model), MODEL),
    ]
    with ssh_systemd_host(NAME, workdir, binds, {"vllm@.service": dropin()}) as (fleet, machine):
        yield fleet, machine


def inventory(fleet: SshFleet, pins: Path) -> Path:
    return fleet.write_inventory(
        fleet.workdir / "inventory.yml",
        group_vars={
            "rocmdoctor_controller_cache": str(fleet.workdir / "controller-cache"),
            "rocmdoctor_bundles_dir": str(pins),
            "rocmdoctor_family": "gfx1151",
            "rocmdoctor_preflight_ignore": NO_GPU_CHECKS,
            "rocmdoctor_model": MODEL,
            "rocmdoctor_instances": "per-partition",
            "rocmdoctor_instances_args": LAYOUT_ARGS,
            "rocmdoctor_server_args": [
                "--served-model-name",
                "tiny",
                "--max-model-len",
                "512",
                "--timeout",
                "120",
            ],
            "rocmdoctor_ready_timeout_s": 300,
        },
    )


def read(machine, path: str) -> str:
    return machine.run(["cat", path]).stdout


@pytest.fixture(scope="module")
def runs(rack_host, fleet_upstream):
    """Converged, converged again, checked, and checked against another layout."""
    fleet, machine = rack_host
    inv = inventory(fleet, fleet_upstream.pins)
    out = {}
    out["first"] = run_playbook(fleet, inv)
    out["pids"] = {n: machine.unit_property(f"vllm@{n}.service", "MainPID") for n in ("0", "1")}
    out["second"] = run_playbook(fleet, inv)
    files = ["/etc/systemd/system/vllm@.service", "/etc/systemd/system/vllm.target"]
    files += [f"{ENV_DIR}/{n}.env" for n in ("0", "1")]
    stamp = "stat -c '%n %Y %s' " + " ".join(files) + f"; ls {ENV_DIR}"
    out["before"] = machine.run(stamp).stdout
    out["check"] = run_playbook(fleet, inv, "--check", "--diff")
    # Another layout (one instance instead of two): what would change, shown, nothing written.
    out["other"] = run_playbook(
        fleet,
        inv,
        "--check",
        "--diff",
        "--tags",
        "preflight,service",
        "-e",
        json.dumps({"rocmdoctor_instances_args": [*LAYOUT_ARGS[:2], "--count", "1"]}),
    )
    out["after"] = machine.run(stamp).stdout
    for key in ("first", "second", "check", "other"):
        run = out[key]
        (fleet.workdir / f"{key}.log").write_text(run.stdout + run.stderr)
        print(f"{key}: rc={run.rc} {run.seconds:.1f} s {run.recap()}")
    return out


def test_the_host_converges_to_two_instances_each_smoke_tested(rack_host, runs):
    fleet, machine = rack_host
    first = runs["first"]
    assert first.rc == 0 and first.recap()["node"]["failed"] == 0, first.stdout[-6000:]
    assert first.recap()["node"]["changed"] > 0
    # one smoke result per instance
    for name, port in (("0", 8000), ("1", 8001)):
        assert f"rocmdoctor smoke passed on node vllm@{name} (http://127.0.0.1:{port})" in first.stdout
    target = read(machine, "/etc/systemd/system/vllm.target")
    assert "Wants=vllm@0.service vllm@1.service\n" in target
    template = read(machine, "/etc/systemd/system/vllm@.service")
    assert "EnvironmentFile=/etc/rocmdoctor/vllm/%i.env" in template and "PartOf=vllm.target" in template
    assert machine.run(["ls", ENV_DIR]).stdout.split() == ["0.env", "1.env"]
    for name, port, devices in (("0", 8000, "0"), ("1", 8001, "1")):
        env = read(machine, f"{ENV_DIR}/{name}.env")
        assert f"ROCR_VISIBLE_DEVICES={devices}\n" in env and f"ROCMDOCTOR_PORT={port}\n" in env, env
        assert "ROCMDOCTOR_TENSOR_PARALLEL_SIZE=1\n" in env and "ROCMDOCTOR_GPU_MEMORY_UTILIZATION=0." in env
        assert machine.unit_property(f"vllm@{name}.service", "ActiveState") == "active"
        # what systemd started each instance with: its own port and devices, from its own file
        seen = json.loads(read(machine, f"/var/lib/vllm/instance-{port}.json"))
        assert seen["env"]["ROCR_VISIBLE_DEVICES"] == devices
        assert seen["argv"][seen["argv"].index("--tensor-parallel-size") + 1] == "1"
    assert machine.unit_property("vllm.target", "ActiveState") == "active"
    assert machine.unit_property("vllm.target", "UnitFileState") == "enabled"
    # readiness went through the template's own gate under systemd
    journal = machine.run(["journalctl", "-u", "vllm@*", "--no-pager"], check=False).stdout
    assert "ready after" in journal


def test_a_rerun_changes_nothing_and_restarts_nothing(rack_host, runs):
    _, machine = rack_host
    second = runs["second"]
    recap = second.recap()["node"]
    assert second.rc == 0 and recap["failed"] == 0 and recap["changed"] == 0, second.stdout[-4000:]
    for name in ("0", "1"):
        assert machine.unit_property(f"vllm@{name}.service", "MainPID") == runs["pids"][name] != "0"
        assert machine.unit_property(f"vllm@{name}.service", "NRestarts") == "0"
    assert "rocmdoctor smoke passed on node vllm@1" in second.stdout


def test_check_mode_on_the_converged_host_changes_nothing(runs):
    check = runs["check"]
    recap = check.recap()["node"]
    assert check.rc == 0 and recap["failed"] == 0 and recap["changed"] == 0, check.stdout[-4000:]


def test_check_diff_with_another_layout_shows_it_and_writes_nothing(runs):
    other = runs["other"]
    recap = other.recap()["node"]
    assert recap["failed"] == 0 and recap["changed"] >= 1, other.stdout[-6000:]
    lines = other.stdout.splitlines()
    # vllm.target's diff: one instance instead of two
    assert "-Wants=vllm@0.service vllm@1.service" in lines, other.stdout[-6000:]
    assert "+Wants=vllm@0.service" in lines
    # the instance the new layout drops, reported (its file would be removed)
    assert any(f"{ENV_DIR}/1.env: instance 1 is not in the new layout" in line for line in lines)
    assert runs["after"] == runs["before"]
