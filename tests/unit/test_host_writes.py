"""The write seam on a foreign root: no link followed, accounts added by our own code, nothing executed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rocmdoctor.host_writes import HostWriter, WriteRefused, is_live


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc" / "group").write_text("root:x:0:\nrender:x:992:\n")
    (root / "etc" / "shadow").write_text("root:*:19000:0:99999:7:::\n")
    (root / "etc" / "login.defs").write_text(
        "SYS_UID_MIN 201\nSYS_UID_MAX 299\nSYS_GID_MIN 201\nSYS_GID_MAX 299\n"
    )
    return root


def test_a_link_on_the_way_is_refused_not_followed(tree, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree / "etc" / "systemd").symlink_to(outside)
    with pytest.raises(WriteRefused, match="refusing to follow"):
        HostWriter(tree).write_file("/etc/systemd/system/vllm.service", b"[Unit]\n")
    assert list(outside.iterdir()) == []


def test_a_planted_link_at_the_target_is_neither_read_nor_written_through(tree, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tree / "etc" / "unit").symlink_to(victim)
    writer = HostWriter(tree)
    with pytest.raises(WriteRefused):
        writer.read_current("/etc/unit")
    writer.write_file("/etc/unit", b"new\n", 0o600)  # the rename replaces the link itself
    assert victim.read_text() == "precious\n"
    assert (tree / "etc" / "unit").read_bytes() == b"new\n" and writer.current_mode("/etc/unit") == 0o600


def test_accounts_are_added_by_editing_the_tree_in_the_system_range(tree):
    writer = HostWriter(tree)
    writer.add_system_user("vllm", "/var/lib/vllm", "/usr/sbin/nologin", "vLLM server")
    vllm = next(x for x in (tree / "etc/passwd").read_text().splitlines() if x.startswith("vllm:")).split(":")
    assert 201 <= int(vllm[2]) <= 299 and vllm[5:] == ["/var/lib/vllm", "/usr/sbin/nologin"]
    assert f"vllm:x:{vllm[3]}:" in (tree / "etc/group").read_text()
    assert (tree / "etc/shadow").read_text().splitlines()[-1].startswith("vllm:!:")
    assert writer.uid_of("vllm") == int(vllm[2]) and "vllm" in writer.group_names()


def test_nothing_is_executed_for_a_tree(tree):
    (tree / "usr" / "sbin").mkdir(parents=True)
    marker = tree / "ran"
    tool = tree / "usr" / "sbin" / "useradd"
    tool.write_text(f"#!/bin/sh\ntouch {marker}\n")
    tool.chmod(0o755)
    with pytest.raises(WriteRefused, match="nothing is executed"):
        HostWriter(tree).run(["useradd", "x"])
    HostWriter(tree).add_system_user("svc", "/var/lib/svc", "/usr/sbin/nologin", "svc")
    assert not marker.exists()


def test_symlinks_are_swapped_atomically_inside_the_tree(tree):
    writer = HostWriter(tree)
    writer.symlink("/opt/rd/current", "bundles/a")
    writer.symlink("/opt/rd/current", "bundles/b")
    assert os.readlink(tree / "opt/rd/current") == "bundles/b"


def test_the_live_root_is_recognised_by_identity_not_by_spelling(tmp_path):
    assert is_live(Path("/")) and is_live(Path("/.")) and not is_live(tmp_path)


def test_a_writer_in_check_mode_records_every_change_and_makes_none(tmp_path):
    """The dry run is a property of the writer, not of the code above it: every change is recorded
    and none is made, whatever calls it."""
    from harness.trees import account_root, tree_state

    root = account_root(tmp_path)
    (root / "etc/existing.conf").write_text("old\n")
    before = tree_state(root)
    writer = HostWriter(root, check_mode=True)
    writer.write_file("/etc/new.conf", b"new\n", 0o600)
    writer.write_file("/etc/existing.conf", b"changed\n")
    writer.chmod("/etc/existing.conf", 0o600)
    assert writer.remove_file("/etc/existing.conf") is True and writer.remove_file("/etc/none") is False
    writer.symlink("/etc/link", "existing.conf")
    writer.add_group("render")
    writer.add_system_user("vllm", "/var/lib/vllm", "/usr/sbin/nologin", "vLLM")
    assert tree_state(root) == before
    assert [(op.action, op.subject) for op in writer.operations] == [
        ("write", "/etc/new.conf"),
        ("write", "/etc/existing.conf"),
        ("chmod", "/etc/existing.conf"),
        ("remove", "/etc/existing.conf"),
        ("remove", "/etc/none"),
        ("symlink", "/etc/link"),
        ("group", "render"),
        ("user", "vllm"),
    ]
    # the same calls for real change the tree, and are recorded the same way
    live = HostWriter(root)
    live.write_file("/etc/new.conf", b"new\n", 0o600)
    live.add_group("render")
    assert (root / "etc/new.conf").read_bytes() == b"new\n" and "render:" in (root / "etc/group").read_text()
    assert [op.action for op in live.operations] == ["write", "group"]
