"""env.multi_gpu over the shell's and the unit's environment, and kernel.combinations, on fixtures."""

from __future__ import annotations

import json
import shutil

import pytest

from harness.hosts import fixture_root, run_check
from rocmdoctor.checks.multi_gpu import visibility_findings
from rocmdoctor.model import Severity, Status


@pytest.fixture
def two_r9700(tmp_path):
    """The rocm-systems#2209 host (four R9700s) with iommu=pt taken off its command line."""
    root = tmp_path / "h"
    shutil.copytree(fixture_root("r9700-x4-ipc-legacy"), root, symlinks=True)
    (root / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz-7.0.0-30-generic root=UUID=0 ro quiet splash\n")
    return root


def set_env(root, **env):
    (root / ".rocmdoctor/env.json").write_text(json.dumps(env))


def findings(result):
    return [f["finding"] for f in result.details["findings"]]


def test_the_fixture_shows_ipc_iommu_and_shm(two_r9700):
    result = run_check(two_r9700, "env.multi_gpu")
    assert result.status is Status.WARN
    text = " ".join(findings(result))
    assert "HSA_ENABLE_IPC_MODE_LEGACY=1 on a host with 4 RDNA GPUs" in text and "rocm-systems#2209" in text
    assert "no iommu=pt" in text and "/dev/shm has 0.06 GiB free" in text
    # The capture itself has iommu=pt (as the #2209 host did): no such finding there.
    untouched = " ".join(findings(run_check(fixture_root("r9700-x4-ipc-legacy"), "env.multi_gpu")))
    assert "iommu" not in untouched and "HSA_ENABLE_IPC_MODE_LEGACY=1" in untouched


def test_fixed_host_passes(two_r9700):
    set_env(two_r9700, HOME="/home/user", HSA_ENABLE_IPC_MODE_LEGACY="0")
    (two_r9700 / "proc/cmdline").write_text("ro quiet iommu=pt\n")
    stat = two_r9700 / ".rocmdoctor/stat.json"
    nodes = json.loads(stat.read_text())
    nodes["/dev/shm"]["free_bytes"] = 32 << 30
    stat.write_text(json.dumps(nodes))
    assert run_check(two_r9700, "env.multi_gpu").status is Status.PASS


def test_the_unit_environment_is_judged_too(two_r9700):
    set_env(two_r9700, HOME="/home/user")
    unit = two_r9700 / "etc/systemd/system/vllm.service"
    unit.parent.mkdir(parents=True)
    unit.write_text(
        "[Service]\nEnvironment=ROCR_VISIBLE_DEVICES=0,1 HIP_VISIBLE_DEVICES=0\n"
        "ExecStart=/opt/x/vllm-server --distributed-executor-backend ray\n"
    )
    envfile = two_r9700 / "etc/rocmdoctor/vllm.env"
    envfile.parent.mkdir(parents=True)
    envfile.write_text("CUDA_VISIBLE_DEVICES=1\n")
    result = run_check(two_r9700, "env.multi_gpu")
    assert result.status is Status.FAIL  # HIP and CUDA disagree: vLLM refuses to start
    text = " ".join(findings(result))
    assert (
        "the unit /etc/systemd/system/vllm.service: HIP_VISIBLE_DEVICES=0 and CUDA_VISIBLE_DEVICES=1" in text
    )
    assert "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES unset" in text
    assert "this shell" not in " ".join(f for f in text.split(";") if "VISIBLE" in f)


@pytest.mark.parametrize(
    ("env", "severity", "words"),
    [
        ({"ROCR_VISIBLE_DEVICES": "2"}, Severity.BLOCKING, "invalid device ordinal"),
        ({"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "1"}, Severity.BLOCKING, "only 1 GPU(s)"),
        ({"ROCR_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0"}, Severity.DEGRADING, "masks compose"),
        ({"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "0"}, None, ""),
    ],
)
def test_visibility_rules(env, severity, words):
    got = visibility_findings("here", env, 2)
    if severity is None:
        assert got == []
    else:
        assert any(s is severity and words in f for s, f, _ in got), got


def test_known_bad_kernel_combination_and_rocm10_layout():
    result = run_check(fixture_root("r9700-rocm10-kernel7"), "kernel.combinations")
    assert result.status is Status.WARN
    assert result.details["matched"] == ["kernel-7.0-on-ubuntu-24.04", "r9700-kernel-7.0-dkms-6.19.4"]
    assert "ROCm/legacy-rocm-build#6630" in result.summary
    dkms = run_check(fixture_root("r9700-rocm10-kernel7"), "driver.dkms")
    assert dkms.details["userspace_rocm"]["release"] == "10.0"


def test_gfx1152_before_6_19_10(tmp_path):
    root = tmp_path / "h"
    shutil.copytree(fixture_root("strix-point"), root, symlinks=True)
    props = root / "sys/class/kfd/kfd/topology/nodes/1/properties"
    props.write_text(props.read_text().replace("gfx_target_version 110500", "gfx_target_version 110502"))
    (root / "proc/sys/kernel/osrelease").write_text("6.19.9-arch1-1\n")
    assert run_check(root, "kernel.combinations").details["matched"] == ["gfx1152-mes-0x82-hang"]
    (root / "proc/sys/kernel/osrelease").write_text("6.19.10-arch1-1\n")
    assert run_check(root, "kernel.combinations").status is Status.PASS
