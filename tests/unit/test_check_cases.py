"""States no fixture shows by itself, made by changing one thing in a copy of a fixture."""

from __future__ import annotations

import json
import shutil

import pytest

from harness.hosts import fixture_root, run_check
from rocmdoctor.host import Host
from rocmdoctor.model import Status
from rocmdoctor.registry import Context, Options

# The line format of amdgpu_debugfs_firmware_info_show() (drivers/gpu/drm/amd/amdgpu/amdgpu_kms.c).
FIRMWARE_INFO = (
    "MES_KIQ feature version: 6, firmware version: 0x0000006c\n"
    "MES feature version: 1, firmware version: 0x{mes:08x}\n"
)


@pytest.fixture
def host_copy(tmp_path):
    def copy(fixture_id):
        root = tmp_path / fixture_id
        shutil.copytree(fixture_root(fixture_id), root, symlinks=True)
        return root

    return copy


def edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("mes, status", [(0x83, Status.WARN), (0x86, Status.WARN), (0x80, Status.PASS)])
def test_known_bad_mes_firmware(host_copy, mes, status):
    root = host_copy("strix-halo-default-ttm")
    info = root / "sys/kernel/debug/dri/1/amdgpu_firmware_info"
    info.parent.mkdir(parents=True)
    info.write_text(FIRMWARE_INFO.format(mes=mes))
    result = run_check(root, "firmware.mes")
    assert result.status is status
    assert (hex(mes) in result.summary) is True


def test_device_group_without_a_name_is_a_mapping_problem(host_copy):
    root = host_copy("rx7900xtx-no-render")
    edit_json(root / ".rocmdoctor/stat.json", lambda d: d["/dev/kfd"].update(gid=65534 + 1))
    result = run_check(root, "access.devices")
    assert result.status is Status.FAIL and "has no name" in result.summary


def test_another_user_is_judged_by_the_files_not_the_session(host_copy):
    root = host_copy("strix-point")
    with (root / "etc/passwd").open("a") as fh:
        fh.write("vllm:x:998:998::/var/lib/vllm:/usr/sbin/nologin\n")
    result = run_check(root, "access.devices", user="vllm")
    assert result.status is Status.FAIL and "sudo usermod -aG render,video vllm" in result.remedy


def test_dkms_seen_through_modules_dep_alone(host_copy):
    root = host_copy("strix-halo-clean")
    (root / "lib/modules/6.19.11-1-cachyos/modules.dep").write_text(
        "updates/dkms/amdgpu.ko.zst: kernel/drivers/gpu/drm/drm_exec.ko.zst\n"
    )
    result = run_check(root, "driver.dkms")
    assert result.status is Status.FAIL and "modules_dep" in result.details["signals"]


def test_ttm_and_amdttm_that_disagree(host_copy):
    root = host_copy("strix-halo-nocwsr-dkms")
    (root / "sys/module/ttm/parameters/pages_limit").write_text("25165824\n")
    result = run_check(root, "memory.ttm")
    assert result.status is Status.WARN and "disagree" in result.summary


def test_port_in_use_without_a_visible_owner(host_copy):
    root = host_copy("mi300x")
    shutil.rmtree(root / "proc/22751")
    result = run_check(root, "processes.orphans")
    assert "port 8000 is already in use by a process rocmdoctor cannot see" in result.summary


def test_secret_flags_are_redacted_in_details(host_copy):
    root = host_copy("mi300x")
    (root / "proc/13673/cmdline").write_bytes(b"vllm\x00serve\x00m\x00--api-key\x00s3cret\x00--token=t0k\x00")
    result = run_check(root, "processes.orphans")
    (engine,) = [p for p in result.details["gpu_processes"] if p["pid"] == 13673]
    assert "s3cret" not in engine["cmdline"] and "t0k" not in engine["cmdline"] and "***" in engine["cmdline"]


def test_memory_too_small_for_any_model_fails(host_copy):
    root = host_copy("strix-point")
    (root / "proc/meminfo").write_text("MemTotal: 32111336 kB\nMemFree: 10000 kB\nMemAvailable: 900000 kB\n")
    result = run_check(root, "memory.gpu")
    assert result.status is Status.FAIL and result.details["recommended_gpu_memory_utilization"] == 0.0


def test_wsl_is_named_as_the_reason(host_copy):
    root = host_copy("no-amd-gpu")
    edit_json(
        root / ".rocmdoctor/stat.json",
        lambda d: d.update(
            {"/dev/dxg": {"type": "char", "mode": "0666", "uid": 0, "gid": 0, "rdev": "10:63"}}
        ),
    )
    result = run_check(root, "gpu.present")
    assert result.status is Status.FAIL and "WSL" in result.summary


def test_strix_halo_with_a_96_gib_carve_out_is_still_an_apu(host_copy):
    """A 96 GiB BIOS "VRAM" carve-out beside a 62.5 GiB GTT (the 63968M of ds4#475): the old vote had
    a large VRAM (dGPU) against unique_id 0 (APU) and said nothing; gfx1151 exists only as an APU."""
    from rocmdoctor.checks.facts import gpus

    root = host_copy("strix-halo-clean")
    device = root / "sys/devices/pci0000:00/0000:65:00.0"
    (device / "mem_info_vram_total").write_text(f"{96 << 30}\n")
    (device / "mem_info_gtt_total").write_text(f"{63968 << 20}\n")
    (gpu,) = gpus(Context(Host(root), Options()))
    assert (gpu.apu, gpu.apu_basis) == (True, "gfx1151 exists only as an integrated GPU")
    assert (gpu.vram_total, gpu.gtt_total) == (96 << 30, 63968 << 20)
    # The runtime reports the larger pool as the device's memory: here the 96 GiB carve-out, whose
    # use this capture lacks, so the verdict names that file instead of sizing the 62.5 GiB GTT.
    result = run_check(root, "memory.gpu")
    assert result.status is Status.WARN and "VRAM" in result.summary
    assert "mem_info_vram_used" in result.summary


def test_a_partition_whose_bank_lost_used_memory_names_the_file(host_copy):
    root = host_copy("mi308x-cpx")
    (root / "sys/class/kfd/kfd/topology/nodes/5/mem_banks/0/used_memory").unlink()
    result = run_check(root, "memory.gpu")
    assert result.status is Status.WARN
    assert "node 5 gfx942 (CPX partition 4 of 4 of GPU 0000:0a:00.0)" in result.summary
    assert "/sys/class/kfd/kfd/topology/nodes/5/mem_banks/0/used_memory" in result.summary


def test_a_large_carve_out_is_told_that_a_small_one_plus_ttm_gives_vllm_more(host_copy):
    """96 GiB of BIOS "VRAM" on a 128 GB Strix Halo: vLLM sizes from GTT, so the carve-out is memory
    vLLM cannot use; memory.ttm says so, with what a 512 MiB carve-out and a raised limit would give."""
    root = host_copy("strix-halo-clean")
    device = root / "sys/devices/pci0000:00/0000:65:00.0"
    (device / "mem_info_vram_total").write_text(f"{96 << 30}\n")
    (device / "mem_info_gtt_total").write_text(f"{15 << 30}\n")
    (root / "proc/meminfo").write_text(
        "MemTotal: 32505856 kB\nMemFree: 20000000 kB\nMemAvailable: 30000000 kB\n"
    )
    result = run_check(root, "memory.ttm")
    assert result.status is Status.WARN
    assert "carve-out" in result.summary and "512" in result.remedy
    assert result.details["suggested_pages_limit"] > (15 << 30) // 4096
