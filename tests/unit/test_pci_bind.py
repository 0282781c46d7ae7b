"""An AMD GPU with no driver bound: named from the PCI bus, with the reason its host leaves behind."""

from __future__ import annotations

import os
import shutil

import pytest

from harness.hosts import fixture_root, run_check
from rocmdoctor.model import Status

SLOT = "0000:bf:00.0"


@pytest.fixture
def unbound(tmp_path):
    root = tmp_path / "host"
    shutil.copytree(fixture_root("strix-halo-unbound"), root, symlinks=True)
    return root


def test_the_fixture_names_the_gpu_and_the_missing_dkms_build(unbound):
    result = run_check(unbound, "gpu.present")
    assert result.status is Status.FAIL
    assert f"1002:1586 (Strix Halo Radeon 8060S) at {SLOT}" in result.summary
    assert "none for the running kernel 6.17.0-7-generic" in result.summary
    assert "dkms autoinstall -k 6.17.0-7-generic" in result.remedy
    assert "unknown vendor" not in result.summary
    assert [r["reason"] for r in result.details["reasons"]] == ["dkms_not_built"]


def test_a_blacklist_is_the_first_reason_with_its_file(unbound):
    conf = unbound / "etc/modprobe.d/blacklist-amdgpu.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("# keep the console\nblacklist amdgpu\n")
    result = run_check(unbound, "gpu.present")
    assert result.details["reasons"][0]["reason"] == "blacklist"
    assert "/etc/modprobe.d/blacklist-amdgpu.conf: `blacklist amdgpu`" in result.summary
    assert "Remove that line from /etc/modprobe.d/blacklist-amdgpu.conf" in result.remedy


def test_nomodeset_on_the_command_line(unbound):
    (unbound / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz ro quiet nomodeset\n")
    shutil.rmtree(unbound / "var/lib/dkms")
    result = run_check(unbound, "gpu.present")
    assert [r["reason"] for r in result.details["reasons"]] == ["cmdline"]
    assert "`nomodeset`" in result.summary


def test_secure_boot_with_a_dkms_module(unbound):
    efivar = unbound / "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-e98c0bb7e4e5"
    efivar.parent.mkdir(parents=True)
    efivar.write_bytes(b"\x06\x00\x00\x00\x01")  # attributes (4 bytes), then the value: 1 = on
    reasons = [r["reason"] for r in run_check(unbound, "gpu.present").details["reasons"]]
    assert reasons == ["dkms_not_built", "secure_boot"]


def test_amdgpu_loaded_and_still_unbound_points_at_the_probe(unbound):
    shutil.rmtree(unbound / "var/lib/dkms")
    (unbound / "sys/module/amdgpu").mkdir(parents=True)
    result = run_check(unbound, "gpu.present")
    assert [r["reason"] for r in result.details["reasons"]] == ["probe_failed"]
    assert "dmesg" in result.remedy


def test_a_bound_gpu_beside_an_unbound_one_is_a_warning(tmp_path):
    root = tmp_path / "host"
    shutil.copytree(fixture_root("r9700"), root, symlinks=True)
    for slot, driver in (("0000:05:00.0", "amdgpu"), (SLOT, None)):
        device = root / f"sys/devices/pci0000:00/{slot}"
        device.mkdir(parents=True)
        (device / "vendor").write_text("0x1002\n")
        (device / "device").write_text("0x7551\n" if driver else "0x1586\n")
        (device / "class").write_text("0x030000\n" if driver else "0x038000\n")
        if driver:
            (root / "sys/bus/pci/drivers/amdgpu").mkdir(parents=True)
            os.symlink("../../../bus/pci/drivers/amdgpu", device / "driver")
        (root / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
        os.symlink(f"../../../devices/pci0000:00/{slot}", root / f"sys/bus/pci/devices/{slot}")
    result = run_check(root, "gpu.unbound")
    assert result.status is Status.WARN
    assert result.details["unbound"] == [
        {"slot": SLOT, "pci_id": "1002:1586", "class": "0x038000", "name": "Strix Halo Radeon 8060S"}
    ]
    assert "Radeon AI PRO R9700" not in result.summary
