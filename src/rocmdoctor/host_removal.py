"""Removing trees rocmdoctor made, with extraction's no-follow rules (archive/tar_rule.TreeWriter).

`OwnDir` holds a directory opened through a descriptor, its last component with O_NOFOLLOW (a link
there is refused, never followed); everything below is reached relative to its parent's descriptor
with O_NOFOLLOW, a link is removed itself and never followed, and a directory on another file system
(a mount inside the tree) is refused rather than entered. No path is resolved again after it was
opened, so a link swapped in meanwhile redirects nothing.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class RemovalRefused(ValueError):
    """The tree cannot be removed within its own bounds; the message says why."""


def _remove_at(parent: int, name: str, device: int) -> None:
    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent)
        return
    if st.st_dev != device:
        raise RemovalRefused(f"{name} is on another file system (a mount inside the tree): unmount it first")
    fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    try:
        for entry in os.listdir(fd):
            _remove_at(fd, entry, device)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


class OwnDir:
    """`base/name` opened without following a link at `name` (the caller chose `base`)."""

    def __init__(self, base: Path, name: str) -> None:
        self.path = base / name
        self.fd: int | None = None
        try:
            parent = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            self.fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise RemovalRefused(f"{self.path} is a symbolic link or not a directory") from None
            raise
        finally:
            os.close(parent)

    def __enter__(self) -> OwnDir:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    @property
    def exists(self) -> bool:
        return self.fd is not None

    def names(self) -> list[str]:
        return sorted(os.listdir(self.fd)) if self.fd is not None else []

    def kernel_path(self, name: str) -> str | None:
        """How the kernel names the directory `name` in it (what other processes' /proc links show)."""
        if self.fd is None:
            return None
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=self.fd)
        except OSError:
            return None
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None
        finally:
            os.close(fd)

    def remove(self, name: str) -> None:
        """Remove the entry `name` and all below it (a link: the link only)."""
        assert self.fd is not None
        _remove_at(self.fd, name, os.fstat(self.fd).st_dev)
