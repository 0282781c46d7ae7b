"""Vendor advice as data with its source (checks/data/vendor_advice.json through facts/vendor_advice.py):
AMD's Instinct bare-metal environment reaches the server's environment, and only on Instinct GPUs."""

from __future__ import annotations

import json
from pathlib import Path

from harness.cli import rocmdoctor
from rocmdoctor.facts import vendor_advice
from rocmdoctor.provision.server.args import Choices, GpuPool, resolve

GIB = 1 << 30
REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "hosts"
INSTINCT_ENV = {"HIP_FORCE_DEV_KERNARG": "1", "SAFETENSORS_FAST_GPU": "1", "TORCH_BLAS_PREFER_HIPBLASLT": "1"}


def test_every_piece_of_advice_names_its_source():
    doc = json.loads((REPO / "checks" / "data" / "vendor_advice.json").read_text())
    entries = [doc["instinct_bare_metal"], *doc["rocm_releases"], *doc["known_issues"]]
    assert all(entry["source"].strip() for entry in entries)
    assert {"10.1", "10.2"} <= set(vendor_advice.rocm_releases())
    (issue,) = vendor_advice.known_issues("gfx1103")
    assert "ROCm/TheRock#7702" in issue.source and issue.first_in == "10.0"
    assert vendor_advice.known_issues("gfx1151") == []


def test_an_instinct_server_gets_amds_bare_metal_environment_with_the_reason():
    pool = GpuPool("node 1 (gfx942)", "gfx942", 192 * GIB, 190 * GIB, False, "gfx942")
    args = resolve(Choices(model="m"), [pool])
    assert args.environment == INSTINCT_ENV
    assert any("HIP_FORCE_DEV_KERNARG" in note and "rocm.docs.amd.com" in note for note in args.notes)
    radeon = GpuPool("node 1 (gfx1151)", "gfx1151", 96 * GIB, 90 * GIB, True, "gfx1151")
    assert resolve(Choices(model="m"), [radeon]).environment == {}


def test_the_unit_for_an_instinct_host_sets_it_and_a_radeon_host_does_not(tmp_path: Path):
    def environment(fixture: str) -> str:
        done = rocmdoctor(
            "unit",
            "--model",
            "/srv/models/tiny",
            "--gpu-memory-utilization",
            "0.9",
            "--prefix",
            str(tmp_path / "prefix"),
            root=FIXTURES / fixture,
        )
        assert done.returncode == 0, done.stderr
        return next(line for line in done.stdout.splitlines() if line.startswith("Environment=PYTHON"))

    instinct = environment("mi300x")
    assert all(f"{name}={value}" in instinct.split() for name, value in INSTINCT_ENV.items())
    assert not any(name in environment("strix-halo-clean") for name in INSTINCT_ENV)
