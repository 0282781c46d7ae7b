"""Atomic file writes: readers see the old file or the new one, never half of one.

Temp file beside the target (same filesystem), fsync, rename, fsync the directory. Temp names are
`.<name>.tmp-<pid>-<random>` (litter.temp_name): the next write of the same file removes the temps of
runs that were killed mid-write (their pid is gone).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from rocmdoctor.litter import owner_pid


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path, mode: int = 0o644) -> Iterator[BinaryIO]:
    """A binary file object that becomes `path` (with `mode`) only if the block completes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    sweep(path.parent, f".{path.name}.tmp-")


def write_atomic(path: Path, content: str | bytes, mode: int = 0o644) -> None:
    with atomic_file(path, mode) as out:
        out.write(content.encode() if isinstance(content, str) else content)


# -- the litter of killed runs (litter.py names it): removed here, by the seam that leaves it ---------


def owner_gone(pid: int) -> bool:
    if pid == os.getpid() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: alive, someone else's
        return False
    return False


def remove_entry(path: Path) -> None:
    """A file or link unlinked, a directory removed as a tree (links inside never followed)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def sweep(directory: Path, prefix: str) -> list[str]:
    """Remove the entries of `directory` named `prefix`... whose owner pid is gone; their names."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for entry in names:
        if not entry.startswith(prefix):
            continue
        pid = owner_pid(entry)
        if pid is not None and owner_gone(pid):
            remove_entry(directory / entry)
            removed.append(entry)
    return removed
