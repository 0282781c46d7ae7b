"""`rocmdoctor fix` judged by what the host does at its next boot, on the host classes of issue 34
(tests/fixtures/fix-cases): the diagnosis, `fix --check`'s plan, `fix --target COPY --yes`, `check` on COPY
showing the pending state, and a rerun that changes nothing. And over every fixture and case: no remedy or
plan adds a user to a group whose gid is 0."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from harness.fix_cases import CASE_IDS, build
from harness.hosts import FIXTURE_IDS, fixture_root
from rocmdoctor.cli import cli as rocmdoctor_cli

USERS = {"lxc-root-node": "hal0"}


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(rocmdoctor_cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def results(root: Path, user: str) -> dict[str, dict[str, Any]]:
    code, out = run("--root", str(root), "check", "--json", "--user", user)
    assert code in (0, 1), out
    return {r["id"]: r for r in json.loads(out)["checks"]}


def fix_json(*args: str) -> dict[str, Any]:
    code, out = run(*args, "--json")
    assert code == 0, out
    return json.loads(out)


class Case:
    """One case carried through diagnosis, plan, apply, the check afterwards and the rerun."""

    def __init__(self, case_id: str, tmp: Path) -> None:
        self.user = USERS.get(case_id, "vllm")
        self.root = build(case_id, tmp / "root")
        self.copy = build(case_id, tmp / "copy")
        self.before = results(self.root, self.user)
        self.plan = fix_json("--root", str(self.root), "fix", "--check", "--user", self.user)
        self.applied = fix_json(
            "--root", str(self.root), "fix", "--target", str(self.copy), "--yes", "--user", self.user
        )
        self.after = results(self.copy, self.user)
        self.rerun = fix_json(
            "--root", str(self.root), "fix", "--target", str(self.copy), "--yes", "--user", self.user
        )

    def item(self, document: dict[str, Any], fix_id: str) -> dict[str, Any]:
        return next(i for i in document["items"] if i["id"] == fix_id)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    return {case_id: Case(case_id, tmp_path_factory.mktemp(case_id)) for case_id in CASE_IDS}


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_a_rerun_changes_nothing(cases: dict[str, Case], case_id: str) -> None:
    assert cases[case_id].rerun["changed"] is False


def sh_cmdline(grub: Path) -> list[str]:
    out = subprocess.run(
        ["/bin/sh", "-c", f'. {grub}; printf "%s %s" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


def test_a_limit_on_the_kernel_command_line_is_changed_there(cases: dict[str, Case]) -> None:
    """kmod applies the command line's ttm.pages_limit after modprobe.d: a file would change nothing."""
    case = cases["cmdline-override"]
    assert (
        case.before["memory.ttm"]["status"] == "warn"
        and "exceeds RAM" in case.before["memory.ttm"]["summary"]
    )
    ttm = case.item(case.plan, "ttm")
    assert ttm["files"] == ["/etc/default/grub"] and "on the kernel command line" in ttm["title"]
    assert "kmod applies after modprobe.d" in ttm["note"] and "BOOT_IMAGE" in ttm["note"]
    assert "-GRUB_CMDLINE_LINUX_DEFAULT=" in ttm["diff"] and "ttm.pages_limit=31719424" in ttm["diff"]
    assert not (case.copy / "etc/modprobe.d/ttm.conf").exists()
    # grub-mkconfig sources the file with sh: the user's words, with only the limit changed.
    old = sh_cmdline(case.root / "etc/default/grub")
    new = sh_cmdline(case.copy / "etc/default/grub")
    assert new == [w if not w.startswith("ttm.pages_limit=") else "ttm.pages_limit=31719424" for w in old]
    assert {row["id"]: row["state"] for row in case.applied["verify"]} == {"ttm": "ok"}
    ttm_after = case.after["memory.ttm"]
    assert ttm_after["summary"].startswith("written; takes effect after a reboot: ttm.pages_limit 31719424")
    pending = ttm_after["details"]["pending"]
    assert pending["next_boot"] == 31719424 and pending["now"] == 33554432
    assert "/etc/default/grub" in pending["source"] and pending["after"] == ["a reboot"]
    assert "Lower it" not in ttm_after["remedy"]


def test_an_initramfs_makes_the_rebuild_part_of_the_pending_state(cases: dict[str, Case]) -> None:
    case = cases["initramfs-ttm"]
    ttm = case.item(case.plan, "ttm")
    assert ttm["files"] == ["/etc/modprobe.d/ttm.conf"] and "`mkinitcpio -P`" in ttm["before_check"]
    assert (case.copy / "etc/modprobe.d/ttm.conf").read_text() == "options ttm pages_limit=31719424\n"
    after = case.after["memory.ttm"]
    assert after["summary"].startswith("written; takes effect after `sudo mkinitcpio -P`")
    assert after["details"]["pending"]["source"] == "/etc/modprobe.d/ttm.conf"
    # fix-kernel no longer repeats the step: what is left is the rebuild and the reboot.
    code, out = run("--root", str(case.copy), "fix-kernel", "--json")
    assert "ttm" not in {s["id"] for s in json.loads(out)["steps"]}


def test_the_ttm_limit_waits_for_the_carveout(cases: dict[str, Case]) -> None:
    """A limit above the RAM the host boots with is not written before the BIOS step it depends on."""
    case = cases["carveout-apu"]
    ttm = case.item(case.plan, "ttm")
    assert "until `carveout` is done" in ttm["refused"]
    assert [s["id"] for s in case.plan["unapplied"]] == ["carveout"]
    assert not (case.copy / "etc/modprobe.d").exists()
    assert "pending" not in case.after["memory.ttm"]["details"]


def test_lxc_root_shell_gets_the_host_side_change_not_a_udev_rule(cases: dict[str, Case]) -> None:
    case = cases["lxc-root-shell"]
    udev = case.item(case.plan, "udev")
    assert "only the host can change it" in udev["refused"] and "pct set" in udev["refused"]
    assert "lxc.cgroup2.devices.allow = c 511:* rwm" in udev["refused"]
    assert not (case.copy / "etc/udev").exists()


def test_a_root_owned_node_is_never_answered_with_group_root(cases: dict[str, Case]) -> None:
    case = cases["lxc-root-node"]
    access = case.before["access.devices"]
    assert "usermod -aG render,video hal0" in access["remedy"] and "chgrp render /dev/kfd" in access["remedy"]
    assert case.item(case.plan, "groups")["groups"] == ["render", "video"]
    assert "pct set" in case.item(case.plan, "udev")["refused"]


def test_rootless_podman_keeps_its_groups_instead_of_the_overflow_gid(cases: dict[str, Case]) -> None:
    case = cases["podman-rootless"]
    remedy = case.before["access.devices"]["remedy"]
    assert "--group-add keep-groups" in remedy and "65534" not in remedy
    assert case.plan["changed"] is False


def test_mi300a_keeps_the_datacenter_dkms_driver(cases: dict[str, Case]) -> None:
    case = cases["mi300a-dkms"]
    dkms = case.before["driver.dkms"]
    assert dkms["details"]["instinct"] is True and "remove" not in dkms["remedy"]
    assert "dkms" not in {i["id"] for i in case.plan["items"]}
    code, out = run("--root", str(case.root), "fix-kernel", "--json")
    assert "dkms" not in {s["id"] for s in json.loads(out)["steps"]}


USERMOD = re.compile(r"usermod -aG (\S+)")


def gid_zero_groups(root: Path) -> set[str]:
    text = (root / "etc/group").read_text(errors="replace") if (root / "etc/group").exists() else ""
    return {f[0] for f in (ln.split(":") for ln in text.splitlines()) if len(f) > 2 and f[2] == "0"} | {
        "root"
    }


@pytest.mark.parametrize("where", [*(f"fixture:{f}" for f in FIXTURE_IDS), *(f"case:{c}" for c in CASE_IDS)])
def test_no_remedy_or_plan_adds_a_user_to_a_group_with_gid_0(where: str, tmp_path: Path) -> None:
    kind, name = where.split(":")
    root = fixture_root(name) if kind == "fixture" else build(name, tmp_path / "root")
    user = USERS.get(name, "vllm")
    forbidden = gid_zero_groups(root)
    for user_option in (user, "root"):  # root: the shell of an LXC container (fix refuses --user root)
        for result in results(root, user_option).values():
            for groups in USERMOD.findall(result.get("remedy", "")):
                assert not set(groups.split(",")) & forbidden, (result["id"], result["remedy"])
    plan = fix_json("--root", str(root), "fix", "--check", "--user", user)
    for item in plan["items"]:
        assert not set(item["groups"]) & forbidden, item


def test_an_unreadable_group_file_is_not_an_empty_one(tmp_path: Path) -> None:
    """issue 35: /etc/group unreadable was read as absent (no render, no video: nothing to do)."""
    import os

    root = build("initramfs-ttm", tmp_path / "root")
    (root / "etc/group").unlink()
    os.mkdir(root / "etc/group")  # unreadable even as root (the tests run as root, so no mode can deny it)
    access = results(root, "user")["access.devices"]
    assert access["status"] == "fail" and access["summary"].startswith("cannot read /etc/group")
    target = build("initramfs-ttm", tmp_path / "target")
    (target / "etc/group").unlink()
    os.mkdir(target / "etc/group")
    code, out = run("--root", str(root), "fix", "--target", str(target), "--check")
    assert code == 2 and "cannot read /etc/group" in out and "Traceback" not in out


def test_a_group_written_for_a_running_service_is_pending_until_its_restart(tmp_path: Path) -> None:
    """fix adds the service user to render; its server, started before, keeps its old groups (credentials(7))."""
    root = build("initramfs-ttm", tmp_path / "root")
    passwd = root / "etc/passwd"
    passwd.write_text(passwd.read_text() + "vllm:x:998:998::/var/lib/vllm:/usr/sbin/nologin\n")
    (root / "etc/group").write_text((root / "etc/group").read_text() + "vllm:x:998:\n")
    (root / "proc/4242").mkdir(parents=True)
    # proc(5)'s status lines of a process of vllm started before the change: only its own group
    (root / "proc/4242/status").write_text(
        "Name:\tpython3\nPid:\t4242\nPPid:\t1\nUid:\t998\t998\t998\t998\nGid:\t998\t998\t998\t998\nGroups:\t998 \n"
    )
    assert results(root, "vllm")["access.devices"]["status"] == "fail"
    applied = fix_json("--root", str(root), "fix", "--target", str(root), "--yes", "--only", "groups")
    assert applied["changed"] is True
    access = results(root, "vllm")["access.devices"]
    assert access["status"] == "warn" and access["summary"].startswith(
        "written; takes effect after a new login"
    )
    assert access["details"]["pending"]["pids"] == [4242]
