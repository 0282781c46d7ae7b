"""Extract the concatenated parts as one gzip'd tar stream, refusing anything that could escape the tree.

Two extractors, one rule (`rocmdoctor.archive.tar_rule`): "tar" runs GNU tar behind the header vetter
(`tar_pipe`), "python" creates the members itself with directory file descriptors. Neither relies
on `os.path.realpath` or tarfile's extraction filters, so a target's Python that predates the 2025
tarfile fixes (Debian 12 ships 3.11.2) extracts as safely as a new one. Decompression runs in a
`pigz -dc` (or `gzip -dc`) subprocess when one exists: it takes the other core.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rocmdoctor.archive.tar_pipe import Counting, Gunzip, bundle_rule, decompressor, gnu_tar, relay_extract
from rocmdoctor.archive.tar_rule import (
    BUFFER,
    ArchiveError,
    MemberRule,
    NoSpaceLeft,
    Readable,
    TarScanner,
    UnsafeArchive,
    extract_tar,
    is_no_space,
    no_space,
)
from rocmdoctor.host_files import tree_bytes

if TYPE_CHECKING:
    from rocmdoctor.host_writes import OwnedTrees

ProgressFn = Callable[[int], None]
CLANG_GLOB = "lib/python3.*/site-packages/_rocm_sdk_core/lib/llvm/bin/clang*"

__all__ = ["BUFFER", "ArchiveError", "NoSpaceLeft", "UnsafeArchive", "extract_stream", "fix_exec_bits"]


def _compressed_total(stream: Readable) -> int | None:
    """The parts' total size when the stream knows it (a PartStream), for the disk-full estimate."""
    total = 0
    try:
        for part in stream.parts:  # type: ignore[attr-defined]
            total += int(part.asset.size)
    except (AttributeError, TypeError, ValueError):
        return None
    return total


def extract_stream(
    stream: Readable, dest: Path, on_bytes: ProgressFn | None = None, extractor: str = "auto"
) -> None:
    """Extract the gzip'd tar read from `stream` into `dest` (which must exist and be empty).

    extractor: "tar" (GNU tar behind the header vetter, fastest), "python" (our own writer),
    "auto" (tar when GNU tar and pigz/gzip exist). Errors the stream raises (a failed download)
    propagate as themselves; a broken archive raises ArchiveError, a refused member UnsafeArchive,
    a full disk NoSpaceLeft (an OSError with errno ENOSPC). The caller removes `dest` on failure."""
    command = decompressor()
    counting = Counting(stream, on_bytes)
    tar = gnu_tar() if extractor in ("auto", "tar") else None
    if extractor == "tar" and not (tar and command):
        raise ArchiveError("--extractor tar needs GNU tar and pigz or gzip on PATH")
    rule = bundle_rule()
    try:
        if tar and command:
            relay_extract(Gunzip(command, counting), dest, tar, TarScanner(rule))
        elif command:
            _python_with_gunzip(Gunzip(command, counting), dest, rule)
        else:
            _python_in_process(counting, dest, rule)
    except OSError as exc:
        if not is_no_space(exc) or isinstance(exc, NoSpaceLeft):
            raise
        # rule.total: the member sizes vetted so far; scaled by the compressed bytes still to come
        total = _compressed_total(stream)
        needed = rule.total * total // counting.count if total and counting.count else rule.total
        raise no_space(dest, tree_bytes(dest), needed) from None


def _python_with_gunzip(gunzip: Gunzip, dest: Path, rule: MemberRule) -> None:
    finished = False
    try:
        extract_tar(gunzip.stdout, dest, rule)
        finished = True
    except ArchiveError:
        gunzip.close(failed=True)
        gunzip.check()  # a download error or a gzip error explains the truncated archive better
        raise
    finally:
        gunzip.close(failed=not finished)
    gunzip.check()


def _python_in_process(counting: Counting, dest: Path, rule: MemberRule) -> None:
    try:
        with gzip.GzipFile(fileobj=counting, mode="rb") as plain:
            extract_tar(plain, dest, rule)
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise ArchiveError(f"the bundle is not a valid gzip stream ({exc})") from None


def fix_exec_bits(trees: OwnedTrees, root: Path) -> list[Path]:
    """The bundled clang loses its exec bit in the tarball and the shim's own chmod fails under
    ProtectSystem=strict, so set it here, through the writer that owns the extracted tree."""
    fixed = []
    for path in root.glob(CLANG_GLOB):
        if path.is_file() and not path.is_symlink():
            trees.add_exec_bits(path)
            fixed.append(path)
    return fixed
