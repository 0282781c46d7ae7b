"""`rocmdoctor fix-kernel`: guidance from the same facts as check, per distro; it changes nothing."""

from __future__ import annotations

import hashlib
import json

import pytest

from harness.hosts import fixture_root, run_cli
from rocmdoctor.checks.kernel_guidance import Finding, distro_family, guidance, kernel_commands


def fix_kernel(fixture_id, *args):
    proc = run_cli("fix-kernel", *args, root=fixture_root(fixture_id))
    assert "Traceback" not in proc.stderr
    return proc


def tree_digest(root):
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def test_broken_strix_halo_gets_dkms_removal_then_a_kernel():
    before = tree_digest(fixture_root("strix-halo-nocwsr-dkms"))
    proc = fix_kernel("strix-halo-nocwsr-dkms", "--json")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and doc["needs_fixing"]
    assert [s["id"] for s in doc["steps"]] == ["dkms", "kernel"]
    dkms, kernel = doc["steps"]
    assert "sudo apt remove --purge amdgpu-dkms amdgpu-dkms-firmware" in dkms["commands"]
    assert any("--no-dkms" in c for c in dkms["commands"])
    assert any("linux-generic-hwe-24.04" in c for c in kernel["commands"])
    assert any("cwsr_size" in v for v in kernel["verify"])
    assert tree_digest(fixture_root("strix-halo-nocwsr-dkms")) == before


def test_default_ttm_gets_the_pages_for_its_ram():
    doc = json.loads(fix_kernel("strix-halo-default-ttm", "--json").stdout)
    (step,) = doc["steps"]
    # 125.6 GiB of RAM, 4 GiB kept for the OS: 121 GiB x 262144 pages.
    assert (
        step["id"] == "ttm"
        and 'echo "options ttm pages_limit=31719424" | sudo tee /etc/modprobe.d/ttm.conf' in step["commands"]
    )
    assert "sudo mkinitcpio -P" in step["commands"]  # CachyOS is Arch-like


def test_clean_host_says_plainly_nothing_needs_fixing():
    proc = fix_kernel("strix-halo-clean")
    assert proc.returncode == 0
    assert proc.stdout.startswith("Nothing needs fixing")


def test_host_without_gpu_is_told_so():
    doc = json.loads(fix_kernel("no-amd-gpu", "--json").stdout)
    assert not doc["needs_fixing"] and doc["headline"].startswith("No AMD GPU")


@pytest.mark.parametrize(
    "distro_id, version, like, expected",
    [
        ("ubuntu", "24.04", "debian", "linux-generic-hwe-24.04"),
        ("ubuntu", "22.04", "debian", "do-release-upgrade"),
        ("ubuntu", "26.04", "debian", "sudo apt full-upgrade"),
        ("debian", "13", "", "trixie-backports"),
        ("debian", "12", "", "bookworm-backports"),
        ("fedora", "43", "", "sudo dnf upgrade --refresh 'kernel*'"),
        ("arch", "", "", "sudo pacman -Syu linux"),
        ("cachyos", "", "arch", "sudo pacman -Syu linux"),
        ("opensuse-tumbleweed", "", "opensuse suse", "sudo zypper dup"),
        ("opensuse-leap", "15.6", "suse opensuse", "Kernel:/stable:/Backport"),
    ],
)
def test_kernel_commands_per_distro(distro_id, version, like, expected):
    commands = kernel_commands(distro_family(distro_id, like), distro_id, version)
    assert any(expected in c for c in commands)
    assert commands[-1] == "sudo reboot"


def test_dkms_on_a_dgpu_is_advice_without_a_kernel_change():
    findings = {
        "driver.dkms": Finding("warn", "amdgpu DKMS build in use"),
        "kernel.cwsr": Finding("pass", "fine"),
        "kernel.version": Finding("pass", "fine"),
    }
    doc = guidance({"id": "ubuntu", "version": "22.04", "like": "debian"}, "5.15.0-131-generic", findings)
    assert [s["id"] for s in doc["steps"]] == ["dkms"]


def test_amdttm_is_set_beside_ttm_under_dkms():
    ttm = Finding(
        "warn",
        "only half",
        {"suggested_pages_limit": 262144 * 60, "governing": "amdttm", "pages_limit": {"ttm": 1, "amdttm": 1}},
    )
    doc = guidance({"id": "fedora", "version": "43"}, "6.18.5", {"memory.ttm": ttm})
    commands = doc["steps"][0]["commands"]
    assert any("/etc/modprobe.d/amdttm.conf" in c for c in commands) and "sudo dracut -f" in commands


CHECK_CASES = fixture_root("strix-halo-clean").parent.parent / "checks"


def test_debian_13_dkms_host_keeps_its_ttm_limit_after_dkms_leaves():
    """ROCm/ROCm#5562: amdttm.pages_limit=32768000 under amdgpu-dkms on Debian 13. check passes memory.ttm
    today, but removing the DKMS driver drops amdttm: fix-kernel must carry the limit over to ttm."""
    proc = run_cli("fix-kernel", "--json", root=CHECK_CASES / "debian13-strix-halo")
    doc = json.loads(proc.stdout)
    assert proc.returncode == 1 and [s["id"] for s in doc["steps"]] == ["dkms", "kernel", "ttm"]
    dkms, kernel, ttm = doc["steps"]
    assert "sudo apt remove --purge amdgpu-dkms amdgpu-dkms-firmware" in dkms["commands"]
    assert any("trixie-backports" in c for c in kernel["commands"])
    assert 'echo "options ttm pages_limit=31719424" | sudo tee /etc/modprobe.d/ttm.conf' in ttm["commands"]
    assert "sudo update-initramfs -u" in ttm["commands"] and "amdttm leaves with amdgpu-dkms" in ttm["why"]


def test_debian_13_default_ttm_gets_the_step_check_asked_for(tmp_path):
    import shutil

    root = tmp_path / "host"
    shutil.copytree(CHECK_CASES / "debian13-strix-halo", root, symlinks=True)
    shutil.rmtree(root / "sys/module/amdttm")  # in-tree driver: ttm at its default, half of RAM
    (root / "sys/module/ttm/parameters").mkdir(parents=True)
    (root / "sys/module/ttm/parameters/pages_limit").write_text("16469033\n")
    (root / "sys/class/drm/renderD128/device/mem_info_gtt_total").write_text(f"{16469033 * 4096}\n")
    check = json.loads(run_cli("check", "--json", "--only", "memory.ttm", root=root).stdout)
    (ttm_check,) = [c for c in check["checks"] if c["id"] == "memory.ttm"]
    assert ttm_check["status"] == "warn"
    doc = json.loads(run_cli("fix-kernel", "--json", root=root).stdout)
    assert [s["id"] for s in doc["steps"]] == ["kernel", "ttm"]
    assert (
        'echo "options ttm pages_limit=31719424" | sudo tee /etc/modprobe.d/ttm.conf'
        in doc["steps"][1]["commands"]
    )
