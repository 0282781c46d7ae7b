"""`rocmdoctor fix` on fixtures: --check shows diffs and writes nothing; --target T applies inside T and a
rerun changes nothing; steps it cannot apply stay printed as fix-kernel prints them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from harness.hosts import FIXTURE_IDS, fixture_root
from rocmdoctor.cli import cli as rocmdoctor_cli
from rocmdoctor.report import load_schema

CHANGE = jsonschema.Draft202012Validator(load_schema("change.schema.json"))


def run(*args: str, stdin: str | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(rocmdoctor_cli, list(args), input=stdin)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_symlink():
            digest.update(os.readlink(path).encode())
        elif path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.mark.parametrize("fixture_id", FIXTURE_IDS)
def test_check_on_every_fixture_writes_nothing(fixture_id):
    root = fixture_root(fixture_id)
    before = tree_digest(root)
    code, out = run("--root", str(root), "fix", "--check", "--json")
    assert code == 0, out
    document = json.loads(out)
    assert document["schema_version"] and document["check"] is True
    CHANGE.validate(document)
    assert tree_digest(root) == before
    # A replayed root is never written, even without --check.
    code, out = run("--root", str(root), "fix", "--yes")
    assert code == 0 and "replayed tree: nothing is written" in out
    assert tree_digest(root) == before


def test_check_shows_the_ttm_diff():
    code, out = run("--root", str(fixture_root("strix-halo-default-ttm")), "fix", "--check")
    assert code == 0
    assert "+++ /etc/modprobe.d/ttm.conf" in out and "+options ttm pages_limit=" in out
    assert "changed=true" in out


def image(tmp_path: Path, *, grub: bool = False) -> Path:
    target = tmp_path / "image"
    (target / "etc").mkdir(parents=True)
    (target / "etc/passwd").write_text(
        "root:x:0:0:root:/root:/bin/bash\nvllm:x:998:998::/var/lib/vllm:/usr/sbin/nologin\n"
    )
    (target / "etc/group").write_text("root:x:0:\nvideo:x:44:\nrender:x:992:alice\nvllm:x:998:\n")
    if grub:
        (target / "etc/default").mkdir()
        (target / "etc/default/grub").write_text(
            'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n'
        )
    return target


def no_iommu(tmp_path: Path) -> Path:
    """The rocm-systems#2209 host (four R9700s) with iommu=pt taken off its kernel command line."""
    root = tmp_path / "diagnosed"
    shutil.copytree(fixture_root("r9700-x4-ipc-legacy"), root, symlinks=True)
    (root / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz-7.0.0-30-generic root=UUID=0 ro quiet splash\n")
    return root


def test_target_applies_inside_the_tree_and_a_rerun_changes_nothing(tmp_path):
    target = image(tmp_path)
    root = str(fixture_root("strix-halo-default-ttm"))
    code, out = run("--root", root, "fix", "--target", str(target), "--user", "vllm", "--yes", "--json")
    assert code == 0, out
    document = json.loads(out)
    assert document["changed"] is True and {i["id"] for i in document["items"] if i["changes"]} == {
        "groups",
        "ttm",
    }
    assert (
        target / "etc/group"
    ).read_text() == "root:x:0:\nvideo:x:44:vllm\nrender:x:992:alice,vllm\nvllm:x:998:\n"
    assert (target / "etc/modprobe.d/ttm.conf").read_text().startswith("options ttm pages_limit=")
    assert {row["id"]: row["state"] for row in document["verify"]} == {"groups": "ok", "ttm": "ok"}
    ttm_verify = [row for row in document["verify"] if row["id"] == "ttm"][0]
    assert "reboot" in ttm_verify["note"]
    code, out = run("--root", root, "fix", "--target", str(target), "--user", "vllm", "--yes", "--json")
    assert code == 0 and json.loads(out)["changed"] is False


def test_kernel_command_line_through_etc_default_grub(tmp_path):
    target = image(tmp_path, grub=True)
    root = str(no_iommu(tmp_path))
    code, out = run("--root", root, "fix", "--target", str(target), "--only", "cmdline", "--yes")
    assert code == 0, out
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash iommu=pt"' in (target / "etc/default/grub").read_text()
    assert "verify cmdline: ok (a reboot)" in out
    code, out = run("--root", root, "fix", "--target", str(target), "--only", "cmdline", "--yes")
    assert "nothing to change" in out


def test_systemd_boot_entries_are_edited(tmp_path):
    target = image(tmp_path)
    entries = target / "boot/loader/entries"
    entries.mkdir(parents=True)
    (entries / "arch.conf").write_text("title Arch\nlinux /vmlinuz-linux\noptions root=UUID=1 rw quiet\n")
    code, out = run(
        "--root",
        str(no_iommu(tmp_path)),
        "fix",
        "--target",
        str(target),
        "--only",
        "cmdline",
        "--check",
    )
    assert code == 0 and "+options root=UUID=1 rw quiet iommu=pt" in out
    assert "iommu" not in (entries / "arch.conf").read_text()


def test_grubby_cannot_run_in_a_tree_and_says_so(tmp_path):
    target = image(tmp_path)
    (target / "usr/sbin").mkdir(parents=True)
    (target / "usr/sbin/grubby").write_text("")
    code, out = run(
        "--root",
        str(no_iommu(tmp_path)),
        "fix",
        "--target",
        str(target),
        "--only",
        "cmdline",
        "--yes",
    )
    assert code == 0 and "[refused] cmdline" in out and "grubby --update-kernel=ALL --args=iommu=pt" in out


def test_steps_it_cannot_apply_stay_printed_like_fix_kernel():
    code, out = run("--root", str(fixture_root("strix-halo-nocwsr-dkms")), "fix", "--check")
    assert code == 0
    assert "not applied by fix" in out and "Boot a kernel with the CWSR export" in out
    # The package removal runs the package manager: on this machine only, and said so for a tree.
    assert (
        "[refused] dkms" in out and "apt-get remove --purge -y amdgpu-dkms" in out and "booted machine" in out
    )


def test_without_yes_on_a_pipe_it_refuses(tmp_path):
    target = image(tmp_path)
    code, out = run("--root", str(fixture_root("strix-halo-default-ttm")), "fix", "--target", str(target))
    assert code == 2 and "--yes" in out
    assert not (target / "etc/modprobe.d").exists()


def test_in_a_docker_container_groups_are_left_to_the_hosts_run_options(tmp_path):
    target = image(tmp_path)
    code, out = run(
        "--root", str(fixture_root("r9700-docker-unmapped-gid")), "fix", "--target", str(target), "--check"
    )
    assert code == 0 and "groups" not in out and "nothing to change" in out


def test_device_nodes_outside_render_get_a_udev_rule(tmp_path):
    root = tmp_path / "diagnosed"
    shutil.copytree(fixture_root("r9700"), root, symlinks=True)
    stat = root / ".rocmdoctor/stat.json"
    nodes = json.loads(stat.read_text())
    nodes["/dev/kfd"].update(gid=0, mode="0600")  # root:root 0600, as before udev's render rule
    stat.write_text(json.dumps(nodes))
    target = image(tmp_path)
    code, out = run(
        "--root", str(root), "fix", "--target", str(target), "--only", "udev", "--user", "user", "--yes"
    )
    assert code == 0, out
    rule = (target / "etc/udev/rules.d/70-rocmdoctor-amdgpu.rules").read_text()
    assert 'KERNEL=="kfd", GROUP="render", MODE="0660"' in rule and "verify udev: ok" in out
