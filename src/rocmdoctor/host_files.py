"""The file side of the write/run seam for the trees rocmdoctor owns: a bundle prefix, a download
directory, a mirror it fills.

`HostWriter` writes single files into a root that may be foreign (a captured tree). A prefix is
different: the user named it, it is ours to build, and its operations are tree-sized (make a staging
tree, swap two trees in one rename, point `current` at a tree, remove a tree, lock the prefix). They
live here, so that `provision/` computes what to change and this module is the one that changes it
(`tests/cli/test_provision_io.py` proves `provision/` does no file I/O of its own).

Files in a download directory are opened by `open_owned`: never through a link, only a regular file
owned by this user, because a directory another user can write into could hold a planted link.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import io
import os
import shutil
import stat
from importlib import resources
from pathlib import Path

from rocmdoctor.atomic import fsync_dir


class UnsafeDirectory(ValueError):
    """A download directory that someone else could plant files in; the message says what to do."""


class ForeignFile(ValueError):
    """A file in a download directory that rocmdoctor did not make (a link, another user's, not a file)."""


_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


# -- questions -------------------------------------------------------------------------------------


def lexists(path: Path) -> bool:
    """Something is at `path` (a dangling link counts)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


def exists(path: Path) -> bool:
    return path.exists()


def is_dir(path: Path) -> bool:
    """A directory, or a link to one."""
    return path.is_dir()


def is_file(path: Path) -> bool:
    """A regular file, or a link to one."""
    return path.is_file()


def is_link(path: Path) -> bool:
    return path.is_symlink()


def readlink(path: Path) -> str | None:
    """The target of the link at `path`; None when it is not a link or absent."""
    try:
        return os.readlink(path)
    except OSError:
        return None


def real_path(path: Path) -> str:
    """The canonical path (links resolved) of a path on the live host that rocmdoctor owns."""
    return os.path.realpath(path)


def same_file(a: Path, b: Path) -> bool:
    return os.path.samefile(a, b)


def size(path: Path, follow_links: bool = True) -> int:
    """The size in bytes (0 when absent and not following links: a part not started yet)."""
    if follow_links:
        return path.stat().st_size
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return 0


def open_size(stream: io.FileIO) -> int:
    """The size of an open file."""
    return os.fstat(stream.fileno()).st_size


def list_dir(path: Path) -> list[str]:
    """The names in a directory, sorted."""
    return sorted(os.listdir(path))


def glob(path: Path, pattern: str) -> list[Path]:
    return sorted(path.glob(pattern))


def tree_bytes(root: Path) -> int:
    """Disk space a tree holds (allocated blocks; hard links counted once; links never followed)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def shipped_text(package: str, name: str) -> str:
    """A text file shipped inside a rocmdoctor package (a template, the manifest, a script)."""
    return resources.files(package).joinpath(name).read_text()


def read_head(path: Path, limit: int) -> bytes:
    """At most the first `limit` bytes of a regular file (non-blocking open: a FIFO is refused)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        return os.read(fd, limit)
    finally:
        os.close(fd)


# -- changes ---------------------------------------------------------------------------------------


def make_dirs(path: Path, exist_ok: bool = True) -> None:
    """`path` and its missing parents (FileExistsError for an existing `path` unless exist_ok)."""
    path.mkdir(parents=True, exist_ok=exist_ok)


def remove(path: Path, missing_ok: bool = True) -> None:
    """Remove a file or a link (never what a link points at)."""
    path.unlink(missing_ok=missing_ok)


def replace(source: Path, target: Path) -> None:
    """Rename `source` over `target` in one step."""
    os.replace(source, target)


def remove_tree(path: Path, ignore_errors: bool = False) -> None:
    """Remove a tree rocmdoctor made (links inside are removed, never followed). When `path` itself is a
    link (a bundle directory someone linked elsewhere), the link goes and its target stays."""
    if path.is_symlink():
        try:
            path.unlink()
        except OSError:
            if not ignore_errors:
                raise
        return
    shutil.rmtree(path, ignore_errors=ignore_errors)


def sync_dir(path: Path) -> None:
    fsync_dir(path)


def add_exec_bits(path: Path) -> None:
    path.chmod(path.stat().st_mode | 0o111)


def swap_symlink(link: Path, target: str) -> None:
    """Atomically make `link` a symlink to `target` (never absent, never half-written): a temp link
    `.<name>.tmp-<pid>` renamed over it, then the directory synced."""
    temp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    temp.unlink(missing_ok=True)
    os.symlink(target, temp)
    os.replace(temp, link)
    fsync_dir(link.parent)


def exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (renameat2 RENAME_EXCHANGE); False where unsupported."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def try_lock(path: Path) -> int:
    """An exclusive flock on `path` (created 0644, never through a link), held by the returned
    descriptor until `unlock`; BlockingIOError when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlock(fd: int) -> None:
    os.close(fd)  # closing drops the flock


# -- download directories ----------------------------------------------------------------------------


def secure_dir(path: Path) -> Path:
    """Create `path` (mode 0700) where missing and refuse it where another user could write into it
    or into a directory above it, unless that directory is sticky (like /tmp). Returns the path."""
    path = Path(os.path.abspath(path))
    uid = os.geteuid()
    for ancestor in reversed(path.parents):
        try:
            st = os.stat(ancestor)
        except FileNotFoundError:
            break
        if st.st_uid not in (0, uid):
            raise UnsafeDirectory(
                f"{ancestor} (on the way to the download directory {path}) belongs to uid {st.st_uid}, "
                "who could swap what is below it; pick a --download-dir that only you (or root) own"
            )
        _refuse_others_write(st, ancestor, f"{ancestor} (on the way to the download directory {path})")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(
            f"{path} is {'a symbolic link' if stat.S_ISLNK(st.st_mode) else 'not a directory'}; "
            "rocmdoctor never follows a link in a download directory: remove it and rerun"
        )
    if st.st_uid != uid:
        raise UnsafeDirectory(
            f"the download directory {path} belongs to uid {st.st_uid}, not to this user ({uid}): "
            "someone else made it. Remove it, or pick another --download-dir"
        )
    _refuse_others_write(st, path, f"the download directory {path}")
    return path


def _refuse_others_write(st: os.stat_result, path: Path, named: str) -> None:
    if st.st_mode & _OTHERS_WRITE and not st.st_mode & stat.S_ISVTX:
        raise UnsafeDirectory(
            f"{named} can be written by other users (mode {stat.S_IMODE(st.st_mode):o}) and is not "
            f"sticky: anyone could plant a link there. `chmod go-w {path}` or pick another --download-dir"
        )


READ, CREATE, APPEND = "read", "create", "append"
_FLAGS = {
    READ: (os.O_RDONLY, "rb"),
    CREATE: (os.O_WRONLY | os.O_CREAT | os.O_EXCL, "wb"),  # a new file: fails if anything is there
    APPEND: (os.O_WRONLY | os.O_APPEND, "wb"),
}


def open_owned(path: Path, how: str = READ) -> io.FileIO:
    """A file in a download directory, unbuffered: never through a link, only a regular file of ours.
    `how`: READ, CREATE (exclusively, mode 0600) or APPEND. Raises ForeignFile saying why not."""
    flags, mode = _FLAGS[how]
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ForeignFile(
                f"{path} is a symbolic link; rocmdoctor never follows a link in a download directory "
                "(someone may have planted it): remove it and rerun"
            ) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"owned by uid {st.st_uid}"
        raise ForeignFile(f"{path} is {what}; it was not made by rocmdoctor: remove it and rerun")
    os.set_blocking(fd, True)
    return io.FileIO(fd, mode)  # unbuffered; the caller closes it


def open_plain(path: Path) -> io.FileIO:
    """A file the user handed over (a mirror's part: links allowed), for reading, unbuffered."""
    return io.FileIO(os.open(path, os.O_RDONLY | os.O_CLOEXEC), "rb")
