"""`--family auto`: the family and the go/no-go come from the diagnosis of the host under --root
(fixture trees built from real captures)."""

from __future__ import annotations

import json

HOSTS = "tests/fixtures/hosts"
TAG = "vllm0.1.0-rocm7.0.0-gfx1151"


def _auto(lab, repo, host: str, *args: str):
    return lab.cli("--root", str(repo / HOSTS / host), *lab.install_args("auto", *args))


def test_clean_strix_halo_installs_the_gfx1151_bundle(install_lab, repo):
    install_lab.pin("gfx1151", install_lab.bundle(TAG))
    proc = _auto(install_lab, repo, "strix-halo-clean", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["family"] == "gfx1151" and doc["current"] == TAG and "forced_past" not in doc


def test_blocking_checks_refuse_naming_check_and_remedy_unless_forced(install_lab, repo):
    install_lab.pin("gfx1151", install_lab.bundle(TAG))
    proc = _auto(install_lab, repo, "strix-halo-nocwsr-dkms")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "kernel.cwsr:" in proc.stderr and "fix-kernel" in proc.stderr
    assert "driver.dkms:" in proc.stderr  # blocking on an APU
    assert "--force" in proc.stderr and install_lab.current() is None
    forced = _auto(install_lab, repo, "strix-halo-nocwsr-dkms", "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    doc = json.loads(forced.stdout)
    assert doc["current"] == TAG and any(p.startswith("kernel.cwsr:") for p in doc["forced_past"])


def test_host_without_amd_gpu_is_refused(install_lab, repo):
    install_lab.pin("gfx1151", install_lab.bundle(TAG))
    proc = _auto(install_lab, repo, "no-amd-gpu")
    assert proc.returncode == 1 and "gpu.present:" in proc.stderr and "modprobe amdgpu" in proc.stderr


def test_mi300x_maps_to_gfx942(install_lab, repo):
    install_lab.pin("gfx1151", install_lab.bundle(TAG))  # pins without gfx942
    proc = _auto(install_lab, repo, "mi300x")
    assert proc.returncode == 2 and "unknown GPU family 'gfx942'" in proc.stderr
