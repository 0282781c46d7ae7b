"""The write seam on a foreign root: writes stay inside it, accounts are added by our own code, nothing runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rocmdoctor.host_writes import HostWriter, WriteRefused


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc" / "group").write_text("root:x:0:\nrender:x:992:\nvideo:x:44:alice\n")
    return root


def test_files_and_links_stay_inside_the_root(tree, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree / "etc" / "systemd").symlink_to(outside)  # absolute link out of the tree
    writer = HostWriter(tree)
    writer.write_file("/etc/systemd/system/vllm.service", b"[Unit]\n")
    assert list(outside.iterdir()) == []
    # the link was resolved as inside a chroot: the file lands under root + the link's target
    assert (tree / str(outside).lstrip("/") / "system" / "vllm.service").read_bytes() == b"[Unit]\n"


def test_a_planted_link_at_the_target_is_replaced_not_written_through(tree, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tree / "etc" / "unit").symlink_to(victim)
    writer = HostWriter(tree)
    with pytest.raises(WriteRefused):
        writer.read_current("/etc/unit")  # a link is never read through
    writer.write_file("/etc/unit", b"new\n")
    assert victim.read_text() == "precious\n"
    assert not (tree / "etc" / "unit").is_symlink() and (tree / "etc" / "unit").read_bytes() == b"new\n"


def test_accounts_are_added_by_editing_the_tree(tree):
    writer = HostWriter(tree)
    assert writer.ensure_user("vllm", "/var/lib/vllm", ("render", "video")) is True
    passwd = (tree / "etc" / "passwd").read_text().splitlines()
    group = (tree / "etc" / "group").read_text().splitlines()
    vllm = next(line for line in passwd if line.startswith("vllm:")).split(":")
    assert vllm[5:] == ["/var/lib/vllm", "/usr/sbin/nologin"] and 100 <= int(vllm[2]) < 1000
    assert f"vllm:x:{vllm[3]}:" in group
    assert "render:x:992:vllm" in group and "video:x:44:alice,vllm" in group
    assert writer.ensure_user("vllm", "/var/lib/vllm", ("render",)) is False  # idempotent
    assert writer.ensure_group("render") is False


def test_nothing_is_executed_for_a_tree(tree):
    (tree / "usr" / "sbin").mkdir(parents=True)
    marker = tree / "ran"
    tool = tree / "usr" / "sbin" / "useradd"
    tool.write_text(f"#!/bin/sh\ntouch {marker}\n")
    tool.chmod(0o755)
    with pytest.raises(WriteRefused, match="nothing is executed"):
        HostWriter(tree).run(["useradd", "x"])
    HostWriter(tree).ensure_user("svc", "/var/lib/svc", ())
    assert not marker.exists()


def test_a_link_loop_is_refused(tree):
    os.symlink("loop", tree / "loop")
    with pytest.raises(WriteRefused, match="symbolic links"):
        HostWriter(tree).write_file("/loop/x", b"")
