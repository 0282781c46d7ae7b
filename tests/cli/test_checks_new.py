"""The new host checks (gpu.mixed_vendor, system.numa_balancing, toolchain.jit) and what access.devices
learnt (udev's uaccess ACLs, container gid maps), on the check cases of tests/fixtures/checks/ and, for
toolchain.jit, on this machine's real compiler."""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
import time
from pathlib import Path

import pytest

from conftest import FIXTURES
from harness.hosts import check_json, covered, run_check
from rocmdoctor.checks import load_registry
from rocmdoctor.checks.access import acl_grants
from rocmdoctor.checks.system import count_ranges
from rocmdoctor.host import Host, StatInfo
from rocmdoctor.model import Status
from rocmdoctor.registry import Context, run_isolated

CASES = FIXTURES / "checks"
CASE_IDS = sorted(p.name for p in CASES.iterdir() if p.is_dir() and not p.name.startswith("_"))
GCC = shutil.which("gcc")


@pytest.fixture
def case_copy(tmp_path):
    def copy(case):
        root = tmp_path / case
        shutil.copytree(CASES / case, root, symlinks=True)
        return root

    return copy


def edit_stat(root, change):
    path = root / ".rocmdoctor/stat.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


# -- every case: a clean report, every problem with a remedy, every read declared -------------------


@pytest.mark.parametrize("case", CASE_IDS)
def test_every_case_reports_without_traceback_and_every_problem_has_a_remedy(case):
    rc, report, stderr = check_json(CASES / case)
    assert "Traceback" not in stderr and rc in (0, 1)
    for check in report["checks"]:
        assert check["status"] != "error", (case, check)
        if check["status"] in ("warn", "fail"):
            assert check["remedy"], (case, check["id"])


@pytest.mark.parametrize("case", CASE_IDS)
def test_every_case_file_is_listed_in_its_sources(case):
    root = CASES / case
    listed = (root / "SOURCES.md").read_text()
    for path in root.rglob("*"):
        rel = str(path.relative_to(root))
        if path.is_file() and not rel.startswith(".rocmdoctor") and rel != "SOURCES.md":
            assert f"`{rel}`" in listed or f"`{rel} -> " in listed, rel


# -- gpu.mixed_vendor ----------------------------------------------------------------------------


def test_nvidia_with_its_driver_names_the_vllm_error_and_the_remedy():
    result = run_check(CASES / "mixed-amd-nvidia", "gpu.mixed_vendor")
    assert result.status is Status.WARN
    assert "Only one platform plugin can be activated, but got: ['cuda', 'rocm']" in result.summary
    assert "10de:2330 at 0000:00:06.0 (driver nvidia)" in result.summary and "580.159.04" in result.summary
    # The remedy rests on what vLLM's source does: its own pynvml, so no pip uninstall helps.
    assert "vllm.third_party.pynvml" in result.remedy and "DevicePolicy=closed" in result.remedy
    assert "modprobe -r nvidia_drm nvidia_modeset nvidia_uvm nvidia" in result.remedy


def test_nvidia_card_without_nvidia_driver_passes(case_copy):
    root = case_copy("mixed-amd-nvidia")
    link = root / "sys/bus/pci/devices/0000:00:06.0/driver"
    link.unlink()
    link.symlink_to("../../../bus/pci/drivers/nouveau")
    shutil.rmtree(root / "sys/module/nvidia")
    shutil.rmtree(root / "proc/driver/nvidia")
    edit_stat(root, lambda d: [d.pop(k) for k in list(d) if k.startswith("/dev/nvidia")])
    result = run_check(root, "gpu.mixed_vendor")
    assert (
        result.status is Status.PASS
        and "driver nouveau" in result.summary
        and "NVML cannot" in result.summary
    )


def test_nvidia_device_nodes_alone_still_warn(case_copy):
    """A container may see /dev/nvidia* without /sys/bus/pci or the module: NVML can still initialise."""
    root = case_copy("mixed-amd-nvidia")
    shutil.rmtree(root / "sys/bus/pci/devices/0000:00:06.0")
    shutil.rmtree(root / "sys/module/nvidia")
    shutil.rmtree(root / "proc/driver/nvidia")
    result = run_check(root, "gpu.mixed_vendor")
    assert result.status is Status.WARN and "/dev/nvidiactl" in result.summary


def test_amd_only_host_passes_and_vga_of_another_vendor_is_not_nvidia(case_copy):
    root = case_copy("mixed-amd-nvidia")
    (root / "sys/bus/pci/devices/0000:00:06.0/vendor").write_text("0x8086\n")
    shutil.rmtree(root / "sys/module/nvidia")
    shutil.rmtree(root / "proc/driver/nvidia")
    edit_stat(root, lambda d: [d.pop(k) for k in list(d) if k.startswith("/dev/nvidia")])
    assert run_check(root, "gpu.mixed_vendor").status is Status.PASS


# -- system.numa_balancing ---------------------------------------------------------------------------


def test_two_socket_instinct_with_balancing_on_warns_with_a_persistent_remedy():
    result = run_check(CASES / "instinct-numa", "system.numa_balancing")
    assert result.status is Status.WARN and "2 NUMA nodes" in result.summary and "gfx942" in result.summary
    assert "sudo sysctl -w kernel.numa_balancing=0" in result.remedy
    assert "/etc/sysctl.d/" in result.remedy


@pytest.mark.parametrize(
    "online, balancing, status",
    [("0-1\n", "0\n", Status.PASS), ("0\n", "1\n", Status.PASS), ("0-3\n", "2\n", Status.WARN)],
)
def test_numa_balancing_verdicts(case_copy, online, balancing, status):
    root = case_copy("instinct-numa")
    (root / "sys/devices/system/node/online").write_text(online)
    (root / "proc/sys/kernel/numa_balancing").write_text(balancing)
    assert run_check(root, "system.numa_balancing").status is status


def test_numa_layout_falls_back_to_kfd_cpu_nodes(case_copy):
    root = case_copy("instinct-numa")
    (root / "sys/devices/system/node/online").unlink()
    result = run_check(root, "system.numa_balancing")
    assert result.status is Status.WARN and result.details["numa_nodes"] == 2


def test_numa_balancing_is_skipped_off_instinct():
    assert run_check(CASES / "mixed-amd-nvidia", "system.numa_balancing").status is Status.SKIP
    assert run_check(CASES / "desktop-uaccess", "system.numa_balancing").status is Status.SKIP


def test_node_list_ranges():
    assert count_ranges("0-1,3\n") == 3 and count_ranges("0") == 1 and count_ranges("x-1") is None


# -- access.devices: uaccess and containers ---------------------------------------------------------------


def test_desktop_user_reaching_the_gpu_only_through_uaccess_is_warned():
    result = run_check(CASES / "desktop-uaccess", "access.devices")
    assert result.status is Status.WARN and "uaccess" in result.summary
    assert result.details["acl_only"] == ["/dev/kfd", "/dev/dri/renderD128"]
    assert result.remedy.startswith("sudo usermod -aG render,video alice")


def test_uaccess_tag_without_the_users_acl_fails_and_says_why(case_copy):
    root = case_copy("desktop-uaccess")
    edit_stat(root, lambda d: [d[k].update(acl=["user::rw-", "group::rw-", "other::---"]) for k in d])
    result = run_check(root, "access.devices")
    assert result.status is Status.FAIL and "active local seat session" in result.summary


def test_a_mask_that_drops_write_denies(case_copy):
    root = case_copy("desktop-uaccess")
    edit_stat(root, lambda d: [d[k].update(acl=["user:1000:rw-", "mask::r--"]) for k in d])
    assert run_check(root, "access.devices").status is Status.FAIL


def test_lxc_render_node_outside_the_gid_map_is_named_with_the_container_remedy():
    result = run_check(CASES / "lxc-unmapped", "access.devices")
    assert result.status is Status.FAIL
    assert result.summary.startswith("/dev/kfd opens but /dev/dri/renderD128 does not")
    assert "gid 65534" in result.summary and "uid_map 0 100000 65536" in result.summary
    assert "pct set" in result.remedy and "lxc config device add" in result.remedy


def test_overflow_gid_with_a_name_is_still_a_mapping_problem(case_copy):
    """Debian names 65534 nogroup: `usermod -aG nogroup` would be the wrong remedy."""
    root = case_copy("lxc-unmapped")
    with (root / "etc/group").open("a") as fh:
        fh.write("nogroup:x:65534:\n")
    result = run_check(root, "access.devices")
    assert result.status is Status.FAIL and "nogroup" not in result.remedy and "overflow" in result.summary


def test_identity_maps_are_not_a_container(case_copy):
    root = case_copy("lxc-unmapped")
    for name in ("uid_map", "gid_map"):
        (root / f"proc/self/{name}").write_text("         0          0 4294967295\n")
    edit_stat(root, lambda d: d["/dev/dri/renderD128"].update(gid=992))
    assert run_check(root, "access.devices").status is Status.PASS


def _acl_xattr(uid: int, perm: int, mask: int) -> bytes:
    entries = [
        (0x01, 6, 0xFFFFFFFF),
        (0x02, perm, uid),
        (0x04, 6, 0xFFFFFFFF),
        (0x10, mask, 0xFFFFFFFF),
        (0x20, 0, 0xFFFFFFFF),
    ]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def test_live_acls_are_read_from_the_real_xattr(tmp_path):
    node = tmp_path / "renderD128"
    node.write_bytes(b"")
    node.chmod(0o660)
    try:
        os.setxattr(node, "system.posix_acl_access", _acl_xattr(1000, 6, 6))
    except OSError as exc:  # a file system without POSIX ACLs cannot hold the case
        pytest.fail(f"tmp_path's file system takes no POSIX ACL: {exc}")
    host = Host(Path("/"))
    read = host.acl(str(node))
    assert read.ok and "user:1000:rw-" in read.value and "mask::rw-" in read.value
    ctx = Context(host)
    info = StatInfo(str(node), "file", 0o660, 0, 0)
    assert acl_grants(ctx, info, 1000, set()) is True and acl_grants(ctx, info, 1001, set()) is False
    os.setxattr(node, "system.posix_acl_access", _acl_xattr(1000, 6, 4))
    assert acl_grants(ctx, info, 1000, set()) is False
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    assert host.acl(str(plain)).state.value == "missing"


# -- WSL and radeon keep their clear verdicts ---------------------------------------------------------------


def test_wsl_is_named():
    rc, report, _ = check_json(CASES / "wsl")
    present = next(c for c in report["checks"] if c["id"] == "gpu.present")
    assert rc == 1 and present["status"] == "fail" and "WSL" in present["summary"]
    assert "native Linux" in present["remedy"]


def test_cpu_only_kfd_with_a_radeon_driven_gpu_says_so():
    rc, report, _ = check_json(CASES / "radeon-only")
    present = next(c for c in report["checks"] if c["id"] == "gpu.present")
    assert rc == 1 and present["status"] == "fail"
    assert "none is a GPU" in present["summary"] and "(radeon)" in present["summary"]


# -- toolchain.jit -------------------------------------------------------------------------------------


def test_toolchain_does_not_run_on_a_replayed_root():
    result = run_check(CASES / "mixed-amd-nvidia", "toolchain.jit")
    assert result.status is Status.SKIP and "replayed root" in result.summary


def _bundle(tmp_path: Path, compiler_script: str | None) -> Path:
    """A prefix whose current bundle has bin/python3 and, if given, the bundled clang as a real script."""
    current = tmp_path / "prefix" / "bundles" / "vllm0.20.1-rocm7.12.0-gfx1151"
    (current / "bin").mkdir(parents=True)
    (current / "bin/python3").write_text("")
    if compiler_script is not None:
        clang = current / "lib/python3.12/site-packages/_rocm_sdk_core/lib/llvm/bin/clang"
        clang.parent.mkdir(parents=True)
        clang.write_text("#!/bin/sh\n" + compiler_script + "\n")
        clang.chmod(clang.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "prefix/current").symlink_to("bundles/vllm0.20.1-rocm7.12.0-gfx1151")
    return tmp_path / "prefix"


def test_working_compiler_links_a_shared_object(tmp_path):
    assert GCC is not None, "tests/setup/10-system-packages.sh installs gcc"
    prefix = _bundle(tmp_path, f'exec {GCC} "$@"')
    started = time.perf_counter()
    result = run_check(Path("/"), "toolchain.jit", prefix=str(prefix))
    elapsed = time.perf_counter() - started
    assert result.status is Status.PASS, result.summary
    # "ends" (the compile has a deadline), not a speed: tests/bench/check_speed.py measures speed
    assert result.details["bundle_compiler"] is True and elapsed < 30


def test_compiler_without_libc_headers_fails_naming_them(tmp_path):
    assert GCC is not None, "tests/setup/10-system-packages.sh installs gcc"
    prefix = _bundle(tmp_path, f'exec {GCC} -nostdinc "$@"')  # a real gcc that finds no stdlib.h
    result = run_check(Path("/"), "toolchain.jit", prefix=str(prefix))
    assert result.status is Status.FAIL and "libc headers missing" in result.summary, result.summary
    assert "stdlib.h" in result.details["stderr_tail"]
    assert "build-essential" in result.remedy  # this machine is Debian


@pytest.mark.parametrize(
    "stderr, piece",
    [
        # The messages users report (peers-and-pain-points.md; ld and clang wording).
        ("/usr/bin/ld: cannot find crti.o: No such file or directory", "crti.o"),
        ("ld.lld: error: unable to find library -lgcc_s", "libgcc_s"),
        ("/usr/bin/ld: cannot find -lgcc_s: No such file or directory", "libgcc_s"),
        ('clang: error: unable to execute command: Executable "ld" doesn\'t exist!', "linker"),
        ("fatal error: stdlib.h: No such file or directory", "libc headers"),
    ],
)
def test_link_errors_name_the_missing_piece(stderr, piece):
    from rocmdoctor.checks.toolchain import diagnose

    assert piece in diagnose(stderr)


def test_unstartable_bundled_compiler_says_how_to_repair(tmp_path):
    prefix = _bundle(tmp_path, "exit 0")
    clang = next((tmp_path / "prefix").rglob("clang"))
    clang.chmod(0o644)
    result = run_check(Path("/"), "toolchain.jit", prefix=str(prefix))
    assert result.status is Status.FAIL and "chmod +x" in result.remedy


def test_before_install_only_the_files_are_looked_for(tmp_path):
    result = run_check(Path("/"), "toolchain.jit", prefix=str(tmp_path / "empty-prefix"))
    assert result.details["bundle_installed"] is False
    assert result.status in (Status.PASS, Status.WARN)
    assert (result.status is Status.PASS) == (not result.details["missing_files"])


@pytest.mark.parametrize("case", CASE_IDS)
def test_every_path_read_on_a_case_is_declared(case):
    for spec in load_registry().specs:
        if spec.default_enabled is False:
            continue
        host = Host(CASES / case)
        run_isolated(spec, Context(host))
        undeclared = sorted(
            p for p in host.accessed if p != "/" and not any(covered(p, r) for r in spec.reads)
        )
        assert not undeclared, f"{spec.id} read undeclared paths on {case}: {undeclared}"


@pytest.mark.parametrize(
    "case, check_id",
    [
        ("desktop-uaccess", "access.devices"),
        ("lxc-unmapped", "access.devices"),
        ("mixed-amd-nvidia", "gpu.mixed_vendor"),
        ("instinct-numa", "system.numa_balancing"),
    ],
)
def test_a_snapshot_of_a_case_replays_the_same_verdict(tmp_path, case, check_id):
    from harness.hosts import run_cli

    archive = tmp_path / "snap.tar.gz"
    proc = run_cli("snapshot", str(archive), root=CASES / case)
    assert proc.returncode == 0, proc.stderr
    _, original, _ = check_json(CASES / case, "--only", check_id)
    _, replayed, _ = check_json(archive, "--only", check_id)
    pick = lambda r: next((c["status"], c["summary"]) for c in r["checks"] if c["id"] == check_id)  # noqa: E731
    assert pick(replayed) == pick(original)


@pytest.mark.parametrize("driver, status", [("nvidia", Status.WARN), ("nouveau", Status.PASS)])
def test_nvidia_seen_only_through_the_drm_class(case_copy, driver, status):
    """Where /sys/bus/pci is not visible the DRM class still names the card and its driver."""
    root = case_copy("mixed-amd-nvidia")
    shutil.rmtree(root / "sys/bus/pci")
    shutil.rmtree(root / "sys/module/nvidia")
    shutil.rmtree(root / "proc/driver/nvidia")
    edit_stat(root, lambda d: [d.pop(k) for k in list(d) if k.startswith("/dev/nvidia")])
    card = root / "sys/class/drm/card1/device"
    card.mkdir(parents=True)
    # The uevent lines of the H100 capture's PCI function (vendor 10de, device 2330, class 030200).
    card.joinpath("uevent").write_text(
        f"DRIVER={driver}\nPCI_CLASS=30200\nPCI_ID=10DE:2330\nPCI_SLOT_NAME=0000:00:06.0\n"
    )
    result = run_check(root, "gpu.mixed_vendor")
    assert result.status is status and f"(driver {driver})" in result.summary
