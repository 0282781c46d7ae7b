"""Paths under a root, resolved the way the kernel would inside a chroot, and bounded reads of plain files.

A captured tree (a fixture, a snapshot from a stranger) is untrusted: a link in it may point
anywhere. `resolve_inside` walks a host path one component at a time under the root, re-roots
absolute link targets, clamps `..` at the root and gives up after MAX_LINK_HOPS links, so the result
is always a path inside the root. It never calls `os.path.realpath` (whose answer a chain of links
longer than PATH_MAX defeats, CVE-2025-4517).

`read_regular` is the one way to read a file rocmdoctor was handed (a key file, a lock, a meta file):
non-blocking, regular files only (a FIFO, /dev/zero or a directory is refused at once), and bounded.
"""

from __future__ import annotations

import errno
import os
import stat

MAX_LINK_HOPS = 40


class NotRegularFile(OSError):
    """The path is a FIFO, a device, a directory or a socket where a plain file belongs (EINVAL)."""


class FileTooLarge(OSError):
    """The file is larger than what may legitimately be there (EFBIG)."""


def _join(root: str, parts: list[str]) -> str:
    return (root.rstrip("/") or "") + "/" + "/".join(parts)


def resolve_inside(root: str, path: str, follow_last: bool = True) -> str | None:
    """The file under `root` that host path `path` names; None on a link loop (ELOOP)."""
    pending = [p for p in path.split("/") if p not in ("", ".")]
    done: list[str] = []
    hops = 0
    while pending:
        name = pending.pop(0)
        if name == "..":
            if done:
                done.pop()
            continue
        if not pending and not follow_last:
            done.append(name)
            break
        candidate = _join(root, [*done, name])
        try:
            st = os.lstat(candidate)
        except OSError:
            done.append(name)  # absent: the rest is taken literally (only `..` can still apply)
            continue
        if not stat.S_ISLNK(st.st_mode):
            done.append(name)
            continue
        hops += 1
        if hops > MAX_LINK_HOPS:
            return None
        target = os.readlink(candidate)
        if target.startswith("/"):
            done = []
        pending = [p for p in target.split("/") if p not in ("", ".")] + pending
    return _join(root, done)


def _type_name(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def read_regular(path: str | os.PathLike[str], limit: int, follow_links: bool = True) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; never blocks, never reads more than limit+1.

    Raises OSError whose strerror says why: NotRegularFile, FileTooLarge, or the open's own (missing,
    denied, a link with follow_links=False).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(
                errno.EINVAL, f"not a regular file (a {_type_name(st.st_mode)})", os.fspath(path)
            )
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise FileTooLarge(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
        return b"".join(chunks)
    finally:
        os.close(fd)
