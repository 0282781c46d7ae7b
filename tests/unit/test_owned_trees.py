"""HostWriter.trees: a bundle prefix's tree operations through the command's writer. In check mode each
is recorded and none is made; a Layout built without a writer (listing, qualification, tune) refuses
every effect; a real writer makes them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.trees import tree_state
from rocmdoctor.host_writes import HostWriter, OwnedTrees, WriteRefused
from rocmdoctor.provision.bundle.install import Layout


def prefix_with_a_bundle(tmp_path: Path) -> Path:
    prefix = tmp_path / "prefix"
    (prefix / "bundles" / "t1" / "bin").mkdir(parents=True)
    (prefix / "bundles" / "t1" / "bin" / "vllm-server").write_text("#!/bin/sh\n")
    os.symlink("bundles/t1", prefix / "current")
    return prefix


def effects(trees: OwnedTrees, prefix: Path) -> None:
    trees.make_dirs(prefix / "bundles" / "t2")
    trees.write_json(prefix / "lock.json", {"pins": 1})
    trees.swap_symlink(prefix / "previous", "bundles/t1")
    trees.replace(prefix / "bundles" / "t1", prefix / "bundles" / ".t1.old-1")
    trees.remove_tree(prefix / "bundles" / ".t1.old-1")
    trees.remove(prefix / "current")


def test_in_check_mode_every_tree_operation_is_recorded_and_none_is_made(tmp_path):
    prefix = prefix_with_a_bundle(tmp_path)
    before = tree_state(tmp_path)
    writer = HostWriter("/", check_mode=True)
    effects(writer.trees, prefix)
    assert tree_state(tmp_path) == before
    assert [op.action for op in writer.operations] == [
        "mkdir",
        "write",
        "symlink",
        "rename",
        "remove-tree",
        "remove",
    ]
    assert writer.past("removed", "remove") == "would remove"


def test_a_layout_without_a_writer_only_reads(tmp_path):
    prefix = prefix_with_a_bundle(tmp_path)
    layout = Layout(prefix)
    assert layout.current_tag() == "t1" and [b["tag"] for b in layout.installed()] == ["t1"]
    before = tree_state(tmp_path)
    with pytest.raises(WriteRefused, match="only reads"):
        layout.trees.remove_tree(prefix / "bundles" / "t1")
    assert tree_state(tmp_path) == before


def test_a_real_writer_makes_them(tmp_path):
    prefix = prefix_with_a_bundle(tmp_path)
    writer = HostWriter("/")
    effects(writer.trees, prefix)
    assert (prefix / "lock.json").read_text() == '{\n  "pins": 1\n}\n'
    assert os.readlink(prefix / "previous") == "bundles/t1" and not os.path.lexists(prefix / "current")
    assert sorted(p.name for p in (prefix / "bundles").iterdir()) == ["t2"]
    assert writer.past("removed", "remove") == "removed" and len(writer.operations) == 6


def test_a_streamed_file_and_exec_bits_go_through_the_writer_too(tmp_path):
    """A snapshot's archive (atomic_file) and extraction's exec bits (add_exec_bits): recorded, and made
    only by a real writer."""
    clang = tmp_path / "clang"
    clang.write_text("#!/bin/sh\n")
    clang.chmod(0o644)
    out = tmp_path / "snap.tar.gz"
    for check_mode in (True, False):
        writer = HostWriter("/", check_mode=check_mode)
        with writer.trees.atomic_file(out) as stream:
            stream.write(b"archive")
        writer.trees.add_exec_bits(clang)
        assert [(op.action, op.subject) for op in writer.operations] == [
            ("write", str(out)),
            ("chmod", str(clang)),
        ]
        assert out.exists() is not check_mode
        assert (clang.stat().st_mode & 0o111 == 0o111) is not check_mode
    assert out.read_bytes() == b"archive"
