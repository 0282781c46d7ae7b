"""Resolution inside a root without realpath, and the one bounded reader for files handed to rocmdoctor."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from rocmdoctor.rootfs import FileTooLarge, NotRegularFile, read_regular, resolve_inside


def inside(root: Path, real: str | None) -> bool:
    return real is not None and (real == str(root) or real.startswith(str(root) + "/"))


@pytest.mark.parametrize(
    "link_target",
    ["/etc/passwd", "../../../../../../etc/passwd", "/../../etc", "a/../../..", "//etc//shadow"],
)
def test_every_link_resolves_inside(tmp_path, link_target):
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / "l").symlink_to(link_target)
    real = resolve_inside(str(root), "/a/l/x")
    assert inside(root, real), real


def test_a_chain_longer_than_path_max_cannot_escape(tmp_path):
    """CVE-2025-4517's shape: many nested links whose expanded path exceeds PATH_MAX, then `..`s."""
    root = tmp_path / "root"
    root.mkdir()
    name = "d" * 200
    # Built through directory fds: the deepest absolute path is longer than PATH_MAX by design, so it
    # could not be named from the top (and how long depends on where tmp_path is).
    current = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for i in range(20):  # 20 x 200 chars > PATH_MAX (4096) once expanded
        os.mkdir(name, dir_fd=current)
        os.symlink(name, f"l{i}", dir_fd=current)
        deeper = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=current)
        os.close(current)
        current = deeper
    os.close(current)
    chain = "/".join(f"l{i}" for i in range(20))
    (root / "escape").symlink_to(chain + "/" + "../" * 60 + "etc/passwd")
    real = resolve_inside(str(root), "/escape")
    assert inside(root, real) and real == f"{root}/etc/passwd"


def test_a_loop_gives_none(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    assert resolve_inside(str(tmp_path), "/a/x") is None


def test_reader_refuses_fifo_device_directory_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    for path in (fifo, Path("/dev/zero"), tmp_path):
        with pytest.raises((NotRegularFile, IsADirectoryError)):
            read_regular(path, 1024)
    assert time.monotonic() - started < 5  # "ends": none of these may block


def test_reader_is_bounded_even_when_the_file_grows(tmp_path):
    big = tmp_path / "big"
    with open(big, "wb") as fh:
        fh.truncate(1 << 30)  # sparse: 1 GiB that costs nothing
    with pytest.raises(FileTooLarge):
        read_regular(big, 4096)
    small = tmp_path / "small"
    small.write_bytes(b"abc")
    assert read_regular(small, 3) == b"abc"


def test_reader_does_not_follow_a_link_when_asked(tmp_path):
    (tmp_path / "target").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(OSError):
        read_regular(tmp_path / "link", 10, follow_links=False)
    assert read_regular(tmp_path / "link", 10) == b"x"


def test_reader_on_a_fifo_with_a_writer_does_not_wait(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    stop = threading.Event()

    def writer() -> None:
        fd = os.open(fifo, os.O_RDWR)
        stop.wait(10)
        os.close(fd)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        with pytest.raises(NotRegularFile, match="FIFO"):
            read_regular(fifo, 10)
    finally:
        stop.set()
        thread.join()
