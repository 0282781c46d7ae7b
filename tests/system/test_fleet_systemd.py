"""site.yml against a host whose service manager is a real systemd (a systemd-nspawn container
reached over real SSH): the service phase writes the unit, systemd starts the real vLLM CPU engine
through the test bundle, readiness is polled, and the smoke phase passes.

The container has no GPU, so its diagnosis is told to ignore the GPU checks (the fixture-backed
fleet test covers preflight verdicts), and its bundle family is given. Test-only drop-in, never
part of the product unit (same as tests/system/test_unit_systemd.py): the engine's venv and pyenv's
Python live under /root here, which the unit's ProtectHome=yes hides.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.engine import vllm_python
from harness.fleet import run_playbook
from harness.nspawn import Bind
from harness.served_bundle import ENGINE_ARGS, ENGINE_ENV
from harness.systemd_fleet import NO_GPU_CHECKS, ssh_systemd_host

pytestmark = [pytest.mark.ssh, pytest.mark.nspawn, pytest.mark.engine, pytest.mark.timeout(1500)]

NAME = "fleet-sysd"
MODEL = "/srv/models/tiny"
VLLM_VENV = vllm_python().parent.parent


def dropin() -> str:
    env = " ".join(f"{k}={v}" for k, v in ENGINE_ENV.items())
    return (
        "[Service]\nProtectHome=tmpfs\n"
        f"BindReadOnlyPaths={Path(sys.base_prefix)} {VLLM_VENV}\nEnvironment={env}\n"
    )


@pytest.fixture(scope="module")
def systemd_host(tmp_path_factory, tiny_model):
    tiny_model.chmod(0o755)
    workdir = tmp_path_factory.mktemp("fleet-systemd")
    binds = [Bind(str(Path(sys.base_prefix))), Bind(str(VLLM_VENV)), Bind(str(tiny_model), MODEL)]
    with ssh_systemd_host(NAME, workdir, binds, {"vllm.service": dropin()}) as (fleet, machine):
        yield fleet, machine


def test_service_phase_starts_the_unit_under_systemd_and_smoke_passes(systemd_host, fleet_upstream):
    fleet, machine = systemd_host
    inventory = fleet.write_inventory(
        fleet.workdir / "inventory.yml",
        group_vars={
            "rocmdoctor_controller_cache": str(fleet.workdir / "controller-cache"),
            "rocmdoctor_bundles_dir": str(fleet_upstream.pins),
            "rocmdoctor_family": "gfx1151",
            "rocmdoctor_preflight_ignore": NO_GPU_CHECKS,
            "rocmdoctor_model": MODEL,
            "rocmdoctor_server_args": [
                "--served-model-name",
                "tiny",
                "--gpu-memory-utilization",
                "0.5",
                "--max-model-len",
                "512",
                "--max-num-seqs",
                "4",
                "--timeout",
                "600",
            ],
            "rocmdoctor_vllm_extra_args": list(ENGINE_ARGS),
            "rocmdoctor_ready_timeout_s": 600,
            # The machine has no C++ compiler, and vLLM's CPU engine compiles its log-probability
            # kernel with Inductor (g++) even under --enforce-eager: the probe's first logprobs request
            # kills the engine here (InvalidCxxCompiler, seen in the unit's journal). The probe is
            # tested against the real engine in tests/system/test_context_probe_engine.py.
            "rocmdoctor_context_probe": "off",
        },
    )
    run = run_playbook(fleet, inventory)
    (fleet.workdir / "converge.log").write_text(run.stdout + run.stderr)
    recap = run.recap()
    assert run.rc == 0 and recap["node"]["failed"] == 0, run.stdout[-6000:]
    assert "rocmdoctor smoke passed on node" in run.stdout
    state = machine.run(["systemctl", "show", "-p", "ActiveState,UnitFileState", "--value", "vllm.service"])
    assert state.stdout.split() == ["active", "enabled"]
    journal = machine.run(["journalctl", "-u", "vllm.service", "--no-pager"], check=False).stdout
    assert "ready after" in journal  # the unit's own readiness gate ran under systemd

    again = run_playbook(fleet, inventory)
    assert again.recap()["node"]["changed"] == 0, again.stdout[-4000:]
    assert (
        machine.run(["systemctl", "show", "-p", "NRestarts", "--value", "vllm.service"]).stdout.strip() == "0"
    )
