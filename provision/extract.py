"""Extract the concatenated parts as one gzip'd tar stream, refusing anything that could escape the tree.

Two layers: our own member check (absolute names, `..`, links leaving the tree, device nodes and
FIFOs, setuid/setgid bits), then tarfile's PEP 706 `data` filter. The Python on a target may predate
the 2025 fixes of `data` (CVE-2025-4517 and friends), so the filter alone is not trusted.
Decompression runs in a `pigz -dc` (or `gzip -dc`) subprocess when one exists: it takes the other core.
"""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import tarfile
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

ProgressFn = Callable[[int], None]
BUFFER = 1 << 20
CLANG_GLOB = "lib/python3.*/site-packages/_rocm_sdk_core/lib/llvm/bin/clang*"


class UnsafeArchive(ValueError):
    def __init__(self, member: str, reason: str) -> None:
        super().__init__(f"archive member {member!r} {reason}; the bundle was not installed")
        self.member = member


class ArchiveError(RuntimeError):
    """The stream is not a readable gzip'd tar (truncated, corrupt)."""


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def check_member(member: tarfile.TarInfo, dest: str) -> None:
    """Our own rules, applied before tarfile's filter; `dest` is the realpath of the target directory."""
    name = member.name
    if "\0" in name or "\0" in member.linkname:
        raise UnsafeArchive(name, "contains a NUL byte")
    if name.startswith("/") or os.path.isabs(name):
        raise UnsafeArchive(name, "has an absolute path")
    if ".." in name.split("/"):
        raise UnsafeArchive(name, "contains '..'")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeArchive(name, "is a device node, FIFO or other special file")
    if member.mode & (stat.S_ISUID | stat.S_ISGID):
        raise UnsafeArchive(name, "has the setuid or setgid bit")
    if member.issym():
        if os.path.isabs(member.linkname):
            raise UnsafeArchive(name, f"is a symlink to the absolute path {member.linkname!r}")
        # Resolve through links already extracted: `a -> .` then `a/b -> ../x` must not pass.
        # realpath, not normpath: with `a -> .`, `a/..` is lexically inside but really the parent.
        parent = os.path.realpath(os.path.join(dest, os.path.dirname(name)))
        target = os.path.realpath(os.path.join(parent, member.linkname))
        if not _inside(parent, dest) or not _inside(target, dest):
            raise UnsafeArchive(name, f"is a symlink leaving the bundle ({member.linkname!r})")
    if member.islnk():
        link = member.linkname
        if os.path.isabs(link) or ".." in link.split("/"):
            raise UnsafeArchive(name, f"is a hard link leaving the bundle ({link!r})")
        if not _inside(os.path.realpath(os.path.join(dest, link)), dest):
            raise UnsafeArchive(name, f"is a hard link leaving the bundle through a symlink ({link!r})")


def _make_filter(dest: Path) -> Callable[[tarfile.TarInfo, str], tarfile.TarInfo | None]:
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is None:
        raise ArchiveError(
            "this Python lacks tarfile extraction filters (PEP 706); use Python 3.10.12, 3.11.4 or newer"
        )
    root = os.path.realpath(dest)

    def member_filter(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        check_member(member, root)
        return data_filter(member, path)

    return member_filter


def _decompressor() -> list[str] | None:
    for tool in ("pigz", "gzip"):
        found = shutil.which(tool)
        if found:
            return [found, "-dc"]
    return None


class _Counting(io.RawIOBase):
    def __init__(self, raw: BinaryIO, on_bytes: ProgressFn | None) -> None:
        self.raw, self.on_bytes = raw, on_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        n = self.raw.readinto(buffer)
        if n and self.on_bytes:
            self.on_bytes(n)
        return n


class Gunzip:
    """A `pigz -dc` (or `gzip -dc`) process fed from `stream` by a thread; the caller reads `.stdout`.

    Errors of the stream (a failed download) are kept and re-raised by `check()` in the caller's
    thread, ahead of the truncated-archive symptom they cause."""

    def __init__(self, command: list[str], stream: BinaryIO, on_bytes: ProgressFn | None) -> None:
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.stdout = self.proc.stdout
        self.stream = stream
        self.errors: list[BaseException] = []
        self.stderr = ""
        self._stopping = False
        self._thread = threading.Thread(
            target=self._feed, args=(_Counting(stream, on_bytes),), name="gunzip-feed", daemon=True
        )
        self._thread.start()

    def _feed(self, source: _Counting) -> None:
        buf = bytearray(BUFFER)
        try:
            while n := source.readinto(buf):
                self.proc.stdin.write(memoryview(buf)[:n])
        except BrokenPipeError:
            pass  # the reader stopped; its own error explains why
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread by check()
            if not self._stopping:
                self.errors.append(exc)
        finally:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass

    def drain(self) -> None:
        """Read to the end so gunzip verifies the whole stream (tar stops at its end marker)."""
        while self.stdout.read(BUFFER):
            pass

    def close(self, failed: bool) -> None:
        if failed and self._thread.is_alive():  # the reader failed first: stop feeding
            self._stopping = True
            cancel = getattr(self.stream, "cancel", None)
            if cancel:
                cancel()
            self.proc.kill()
        self._thread.join()
        self.stdout.close()
        self.stderr = self.proc.stderr.read().decode(errors="replace").strip()
        self.proc.stderr.close()
        self.proc.wait()

    def check(self) -> None:
        if self.errors:
            raise self.errors[0]
        if self.proc.returncode != 0:
            raise ArchiveError(
                f"the bundle is not a valid gzip stream ({self.stderr or f'exit {self.proc.returncode}'})"
            )


def extract_stream(
    stream: BinaryIO, dest: Path, on_bytes: ProgressFn | None = None, extractor: str = "auto"
) -> None:
    """Extract the gzip'd tar read from `stream` into `dest` (which must exist and be empty).

    extractor: "tar" (GNU tar behind our header vetting, fastest), "python" (tarfile + data filter),
    "auto" (tar when GNU tar and pigz/gzip exist). Errors the stream raises (a failed download)
    propagate as themselves; a broken archive raises ArchiveError, an unsafe member UnsafeArchive."""
    command = _decompressor()
    if extractor in ("auto", "tar"):
        from .tarpipe import gnu_tar, relay_extract

        tar = gnu_tar()
        if tar and command:
            relay_extract(Gunzip(command, stream, on_bytes), dest, tar)
            return
        if extractor == "tar":
            raise ArchiveError("--extractor tar needs GNU tar and pigz or gzip on PATH")
    member_filter = _make_filter(dest)
    if command is None:
        _extract(io.BufferedReader(_Counting(stream, on_bytes), BUFFER), "r|gz", dest, member_filter)
        return
    gunzip = Gunzip(command, stream, on_bytes)
    finished = False
    try:
        _extract(gunzip.stdout, "r|", dest, member_filter)
        gunzip.drain()
        finished = True
    except ArchiveError:
        gunzip.close(failed=True)
        gunzip.check()  # a download error explains the truncated archive better
        raise
    finally:
        if gunzip.proc.returncode is None:
            gunzip.close(failed=not finished)
    gunzip.check()


def _extract(fileobj: BinaryIO, mode: str, dest: Path, member_filter) -> None:
    try:
        with tarfile.open(fileobj=fileobj, mode=mode, bufsize=BUFFER) as tar:
            tar.extractall(dest, filter=member_filter)
    except tarfile.FilterError as exc:
        raise UnsafeArchive(exc.tarinfo.name, f"was refused by tarfile's data filter ({exc})") from None
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise ArchiveError(f"the bundle archive is truncated or corrupt ({exc})") from None


def fix_exec_bits(root: Path) -> list[Path]:
    """The bundled clang loses its exec bit in the tarball and the shim's own chmod fails under
    ProtectSystem=strict, so set it here."""
    fixed = []
    for path in root.glob(CLANG_GLOB):
        if path.is_file() and not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o111)
            fixed.append(path)
    return fixed
