"""Host.file_digest and Host.fs_size_bytes: what the cluster pre-flight compares between nodes, read
through the one object that reads the host."""

from __future__ import annotations

import hashlib
import os

from rocmdoctor.cluster.facts import model
from rocmdoctor.host import Host, ReadState


def test_a_small_file_is_hashed_whole_a_large_one_by_size_and_edges(tmp_path):
    small, large = tmp_path / "small.json", tmp_path / "large.bin"
    small.write_bytes(b"{}")
    data = os.urandom(3 << 20)
    large.write_bytes(data)
    host = Host(tmp_path)
    assert (
        host.file_digest("/small.json", 1 << 20, 1 << 10).value
        == f"sha256:{hashlib.sha256(b'{}').hexdigest()}"
    )
    edges = hashlib.sha256(data[: 1 << 10] + data[-(1 << 10) :]).hexdigest()
    assert host.file_digest("/large.bin", 1 << 20, 1 << 10).value == f"edges-sha256:{3 << 20}:{edges}"


def test_a_link_is_never_followed_and_a_fifo_is_not_read(tmp_path):
    (tmp_path / "secret").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "secret")
    os.mkfifo(tmp_path / "fifo")
    host = Host(tmp_path)
    assert host.file_digest("/link", 1 << 20, 1 << 10).state is not ReadState.OK
    assert host.file_digest("/fifo", 1 << 20, 1 << 10).state is ReadState.UNREADABLE
    assert host.file_digest("/absent", 1 << 20, 1 << 10).state is ReadState.MISSING


def test_a_hub_snapshot_names_its_blobs_without_reading_them_and_other_links_are_not_followed(tmp_path):
    snapshot = tmp_path / "hub" / "snapshots" / "0123abcd"
    blobs = tmp_path / "hub" / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    blob = "a" * 64
    (blobs / blob).write_text("weights")
    (snapshot / "model.safetensors").symlink_to(f"../../blobs/{blob}")
    (snapshot / "config.json").write_text("{}")
    (snapshot / "elsewhere").symlink_to("/etc/passwd")
    facts = model(Host(tmp_path), "/hub/snapshots/0123abcd")
    assert facts is not None and facts["revision"] == "0123abcd"
    assert facts["files"]["model.safetensors"] == f"sha256:{blob}"
    assert facts["files"]["config.json"].startswith("sha256:")
    assert facts["files"]["elsewhere"] == "link: not followed"


def test_shm_size_is_the_mount_on_this_host_and_unknown_in_a_captured_tree(tmp_path):
    assert (Host("/").fs_size_bytes("/dev/shm") or 0) > 0
    assert Host(tmp_path).fs_size_bytes("/dev/shm") is None
