"""Hostile snapshot archives (`check --root host.tar.gz`): the bundle corpus and the snapshot's own
attacks (oversized members, meta files reached through links) are refused before a byte is written,
with exit 2 at the CLI; and what `snapshot` captures, replay accepts."""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from conftest import FIXTURES
from harness.hostile_tar import END, archive, corpus, directory, gzip_bytes, hardlink, header, member, symlink
from harness.hosts import check_json, fixture_root, normalize, run_cli
from rocmdoctor import snapshot as snapshot_mod
from rocmdoctor.archive.tar_rule import Limits
from rocmdoctor.host import DEFAULT_READ_LIMIT, Host
from rocmdoctor.snapshot import SnapshotError, unpack

CASES = sorted(c.name for c in corpus("/outside", "../outside"))
# Cases whose first refused member is a symlink: a snapshot holds no symlink outside proc/, so the
# snapshot rule names that before the bundle rule's reason.
SYMLINK_FIRST = ("symlink", "cve", "hardlink-to-symlink", "hardlink-through-symlink")


@pytest.fixture
def replay_tmp(tmp_path, monkeypatch):
    """Unpacking goes to a private TMPDIR, so a test sees everything it leaves behind."""
    box = tmp_path / "tmp"
    box.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(box))
    return box


def _write(tmp_path: Path, raw: bytes, name: str = "hostile.tar.gz") -> Path:
    path = tmp_path / name
    path.write_bytes(gzip_bytes(raw))
    return path


@pytest.mark.parametrize("name", CASES)
def test_the_archive_corpus_is_refused_by_replay(tmp_path, replay_tmp, name):
    outside = tmp_path / "outside"
    outside.mkdir()
    case = {c.name: c for c in corpus(str(outside), "../../outside")}[name]
    with pytest.raises(SnapshotError) as caught:
        unpack(_write(tmp_path, archive(case)))
    message = str(caught.value)
    assert case.expect in message or (name.startswith(SYMLINK_FIRST) and "may not hold" in message), message
    assert list(replay_tmp.iterdir()) == [] and list(outside.iterdir()) == []


@pytest.mark.parametrize(
    "name", ["pax-size-underscore", "cve-2025-4517", "type-char-device", "dotdot", "truncated"]
)
def test_check_with_a_hostile_snapshot_exits_2(tmp_path, name):
    case = {c.name: c for c in corpus(str(tmp_path / "outside"), "../outside")}[name]
    proc = run_cli("check", "--json", root=_write(tmp_path, archive(case)))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "refusing unsafe member" in proc.stderr or "not a readable snapshot archive" in proc.stderr


def _snapshot(*members: bytes) -> bytes:
    return directory(b".rocmdoctor") + b"".join(members) + END


def test_a_member_larger_than_a_capture_is_refused_before_writing(tmp_path, replay_tmp):
    """A 1 GiB member in a tiny archive: refused on its header, nothing written, at once."""
    huge = header(b"sys/big", size=1 << 30) + bytes(1 << 20)
    started = time.monotonic()
    with pytest.raises(SnapshotError, match=r"is 1\.0 GiB, more than the 1\.0 MiB allowed"):
        unpack(_write(tmp_path, _snapshot(huge), "huge.tar.gz"))
    assert time.monotonic() - started < 5 and list(replay_tmp.iterdir()) == []
    # exactly the capture limit is what a snapshot may hold
    dest = unpack(_write(tmp_path, _snapshot(member(b"sys/full", bytes(DEFAULT_READ_LIMIT))), "full.tar.gz"))
    assert (
        (dest / "sys/full").stat().st_size == DEFAULT_READ_LIMIT == snapshot_mod.SNAPSHOT_LIMITS.member_size
    )


def test_count_total_and_depth_are_capped(tmp_path, replay_tmp, monkeypatch):
    deep = b"/".join([b"d"] * (snapshot_mod.SNAPSHOT_LIMITS.depth + 1))
    with pytest.raises(SnapshotError, match="levels deep"):
        unpack(_write(tmp_path, _snapshot(member(deep, b"x")), "deep.tar.gz"))
    monkeypatch.setattr(snapshot_mod, "SNAPSHOT_LIMITS", Limits(member_size=1 << 20, members=5, total=3000))
    many = b"".join(member(b"sys/f%d" % i, b"x") for i in range(10))
    with pytest.raises(SnapshotError, match="one member more than the 5 allowed"):
        unpack(_write(tmp_path, _snapshot(many), "many.tar.gz"))
    big = b"".join(member(b"sys/g%d" % i, bytes(1000)) for i in range(4))
    with pytest.raises(SnapshotError, match="past the 2.9 KiB allowed"):
        unpack(_write(tmp_path, _snapshot(big), "big.tar.gz"))
    assert list(replay_tmp.iterdir()) == []


@pytest.mark.parametrize(
    "attack, message",
    [
        # a hard link to an fd link is a second name for the link: open() of the meta file follows it
        ([symlink(b"proc/1/fd/3", b"/etc/shadow"), hardlink(b".rocmdoctor/env.json", b"proc/1/fd/3")],
         "not a regular file"),
        ([symlink(b".rocmdoctor/env.json", b"../proc/1/fd/3")], "may not hold"),
        ([symlink(b"proc/1/fd/3", b"/etc"), member(b"proc/1/fd/3/shadow", b"x")], "through a symlink"),
        ([symlink(b"proc/1/cwd", b"../../etc")], "may not hold"),
    ],
)  # fmt: skip
def test_meta_files_cannot_be_reached_through_links(tmp_path, replay_tmp, attack, message):
    with pytest.raises(SnapshotError, match=message):
        unpack(_write(tmp_path, _snapshot(*attack)))
    assert list(replay_tmp.iterdir()) == []


def test_meta_dir_as_a_link_is_refused(tmp_path, replay_tmp):
    raw = symlink(b".rocmdoctor", b"/etc") + END
    with pytest.raises(SnapshotError, match="may not hold"):
        unpack(_write(tmp_path, raw))


def test_host_reads_meta_files_without_following_links(tmp_path):
    """A captured tree given as a directory: a meta file or the meta dir that is a link reads as absent."""
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"user": "from-outside", "uid": 0, "gid": 0, "process_gids": []}))
    tree = tmp_path / "tree"
    (tree / ".rocmdoctor").mkdir(parents=True)
    (tree / ".rocmdoctor" / "identity.json").symlink_to(secret)
    (tree / ".rocmdoctor" / "env.json").write_text('{"HIP_VISIBLE_DEVICES": "0"}')
    host = Host(tree)
    assert host.read_json_meta("identity.json") is None
    assert host.read_json_meta("env.json") == {"HIP_VISIBLE_DEVICES": "0"}
    other = tmp_path / "other"
    other.mkdir()
    (other / ".rocmdoctor").symlink_to(secret.parent)
    shutil.copy(secret, secret.parent / "identity.json")
    assert Host(other).read_json_meta("identity.json") is None


def test_a_tree_with_absolute_links_under_proc_snapshots_and_replays(tmp_path):
    """Capture keeps a /proc link only where replay accepts one (absolute or a single name); a relative
    link through the tree is captured by its content. Both reports agree."""
    tree = tmp_path / "tree"
    shutil.copytree(fixture_root("mi300x"), tree, symlinks=True)
    comm = tree / "proc/13673/comm"
    comm.unlink()
    comm.symlink_to("/proc/1/comm")  # absolute: unreadable in the tree, kept as a link
    (tree / "proc/13673/fd/40").symlink_to("/dev/dri/renderD128")
    real_tcp = tree / "proc/net-real/tcp"
    real_tcp.parent.mkdir()
    (tree / "proc/net/tcp").rename(real_tcp)
    (tree / "proc/net/tcp").symlink_to("../net-real/tcp")  # relative, inside: captured by content
    archive_path = tmp_path / "tree.tar.gz"
    proc = run_cli("snapshot", str(archive_path), root=tree)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(archive_path) as tar:
        assert tar.getmember("proc/13673/comm").issym() and tar.getmember("proc/13673/fd/40").issym()
        assert tar.getmember("proc/net/tcp").isfile()
    rc_tree, from_tree, _ = check_json(tree)
    rc_replay, replayed, stderr = check_json(archive_path)
    assert rc_replay != 2 and "Traceback" not in stderr, stderr
    assert normalize(replayed) == normalize(from_tree) and rc_replay == rc_tree


def test_snapshot_links_follow_the_replay_rule():
    keeps = snapshot_mod.replay_keeps_link
    assert keeps(b"proc/1/fd/3", b"/dev/dri/renderD128") and keeps(b"proc/1/fd/4", b"socket:[123]")
    assert keeps(b"proc/1/exe", b"/usr/bin/python3")
    assert not keeps(b"proc/1/fd/3", b"../../../etc") and not keeps(b"proc/1/fd/3", b"..")
    assert keeps(b"sys/bus/pci/devices/0000:03:00.0/driver", b"../../../bus/pci/drivers/amdgpu")
    assert not keeps(b"sys/class/kfd", b"/etc") and not keeps(b".rocmdoctor/env.json", b"/etc/shadow")
    assert not keeps(b"sys/bus/pci/devices/0000:03:00.0/driver/module", b"/etc")


def test_a_real_snapshot_still_replays_and_holds_what_was_captured(tmp_path):
    archive_path = tmp_path / "mi300x.tar.gz"
    assert run_cli("snapshot", str(archive_path), root=fixture_root("mi300x")).returncode == 0
    dest = unpack(archive_path)
    with tarfile.open(archive_path) as tar:
        for info in tar:
            path = dest / info.name
            assert os.path.lexists(path), info.name
            if info.isfile():
                assert path.read_bytes() == tar.extractfile(info).read()
            elif info.issym():
                assert os.readlink(path) == info.linkname


def test_a_tree_with_driver_links_snapshots_and_replays(tmp_path):
    """PCI `driver` links (gpu.mixed_vendor reads their names) are kept as links and replay."""
    tree = FIXTURES / "checks" / "mixed-amd-nvidia"
    archive_path = tmp_path / "mixed.tar.gz"
    proc = run_cli("snapshot", str(archive_path), root=tree)
    assert proc.returncode == 0, proc.stderr
    with tarfile.open(archive_path) as tar:
        assert tar.getmember("sys/bus/pci/devices/0000:03:00.0/driver").issym()
    rc_tree, from_tree, _ = check_json(tree)
    rc_replay, replayed, stderr = check_json(archive_path)
    assert "Traceback" not in stderr and rc_replay == rc_tree, stderr
    assert normalize(replayed) == normalize(from_tree)
