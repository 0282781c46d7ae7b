"""Atomic file writes: readers see the old file or the new one, never half of one.

Temp file beside the target (same filesystem), fsync, rename, fsync the directory. Temp names are
`.<name>.tmp-<pid>-<random>` (litter.temp_name): the next write of the same file removes the temps of
runs that were killed mid-write (their pid is gone).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from rocmdoctor.litter import sweep


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
