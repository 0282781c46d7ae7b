"""The processes of extraction: `pigz -dc` (or `gzip -dc`) and GNU tar, with the vetter between them.

    parts -> [feed thread] -> pigz -dc -> [this process: TarScanner] -> tar -x -C <dest>

The scanner (`rocmdoctor.archive.tar_rule`, the rule shared with the Python extractor and the snapshot
unpacker) parses every header in the one buffer that is then written to tar: the bytes vetted are
the bytes extracted, and a chunk goes to tar only after every header in it passed. Headers are
accepted only in the canonical form GNU tar reads exactly as the scanner does, so tar cannot see a
member the scanner did not.
"""

from __future__ import annotations

import errno
import fcntl
import io
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, cast

from rocmdoctor.archive.tar_rule import (
    BUFFER,
    ArchiveError,
    Limits,
    MemberRule,
    Readable,
    TarScanner,
    UnsafeArchive,
)

ProgressFn = Callable[[int], None]
# A bundle's tree: deep Python packages, but no path deeper than this, and no special limits on size
# (the parts are digest-pinned; disk space is checked by the install).
BUNDLE_LIMITS = Limits(depth=64)
FEED_BUFFER = 128 << 10
SPLICE_MIN = 64 << 10  # member data at least this long goes pipe to pipe
PIPE_SIZE = 1 << 20
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)

__all__ = [
    "ArchiveError",
    "Gunzip",
    "HeaderVetter",
    "UnsafeArchive",
    "bundle_rule",
    "gnu_tar",
    "relay_extract",
]


def bundle_rule() -> MemberRule:
    return MemberRule(BUNDLE_LIMITS, what="the bundle")


class HeaderVetter(TarScanner):
    """The scanner with the bundle rule and no sink: what stands in front of GNU tar."""

    def __init__(self) -> None:
        super().__init__(bundle_rule())


def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    if stream is None:
        raise RuntimeError("subprocess started without the pipe asked for")
    return stream


def gnu_tar() -> str | None:
    found = shutil.which("tar")
    if not found:
        return None
    try:
        version = subprocess.run(
            [found, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found if "GNU tar" in version else None


def decompressor() -> list[str] | None:
    for tool in ("pigz", "gzip"):
        found = shutil.which(tool)
        if found:
            return [found, "-dc"]
    return None


class Counting(io.RawIOBase):
    """Counts the compressed bytes read (for progress, and for the disk-full estimate)."""

    def __init__(self, raw: Readable, on_bytes: ProgressFn | None) -> None:
        self.raw, self.on_bytes = raw, on_bytes
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.raw.readinto(buffer) or 0
        if n:
            self.accepted(n)
        return n

    def accepted(self, n: int) -> None:
        self.count += n
        if self.on_bytes:
            self.on_bytes(n)


class Gunzip:
    """A `pigz -dc` (or `gzip -dc`) process fed from `stream` by a thread; the caller reads `.stdout`.

    Errors of the stream (a failed download) are kept and re-raised by `check()` in the caller's
    thread, ahead of the truncated-archive symptom they cause."""

    def __init__(self, command: list[str], stream: Readable) -> None:
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.stdin, self._stderr = _pipe(self.proc.stdin), _pipe(self.proc.stderr)
        self.stdout = cast(io.BufferedReader, _pipe(self.proc.stdout))  # bufsize -1: buffered
        self.stream = stream
        self._raw: Readable = stream.raw if isinstance(stream, Counting) else stream
        self.errors: list[BaseException] = []
        self.stderr = ""
        self._stopping = False
        self._thread = threading.Thread(target=self._feed, name="gunzip-feed", daemon=True)
        self._thread.start()

    def _feed(self) -> None:
        # Small writes, counted once gunzip took them: the count then lags the decompressed output by
        # little more than the pipes, which keeps the disk-full estimate close.
        buf = bytearray(FEED_BUFFER)
        view = memoryview(buf)
        counting = self.stream if isinstance(self.stream, Counting) else None
        try:
            while n := self._raw.readinto(buf):
                self.stdin.write(view[:n])
                if counting is not None:
                    counting.accepted(n)
        except BrokenPipeError:
            pass  # the reader stopped; its own error explains why
        except BaseException as exc:
            if not self._stopping:
                self.errors.append(exc)
        finally:
            try:
                self.stdin.close()
            except BrokenPipeError:
                pass

    def close(self, failed: bool) -> None:
        if self.proc.returncode is not None:
            return
        if failed and self._thread.is_alive():  # the reader failed first: stop feeding
            self._stopping = True
            cancel = getattr(self._raw, "cancel", None)
            if cancel:
                cancel()
        if failed:
            self.proc.kill()
        self._thread.join()
        self.stdout.close()
        self.stderr = self._stderr.read(1 << 16).decode(errors="replace").strip()
        self._stderr.close()
        self.proc.wait()

    def check(self) -> None:
        if self.errors:
            raise self.errors[0]
        if self.proc.returncode and self.proc.returncode > 0:  # < 0: we killed it
            raise ArchiveError(
                f"the bundle is not a valid gzip stream ({self.stderr or f'exit {self.proc.returncode}'})"
            )


def _disk_full(tar_err: str, dest: Path) -> bool:
    """GNU tar says "No space left" for a failed open but only "Wrote only N of M bytes" for a short
    write; the latter counts as disk full when the filesystem has (almost) nothing left."""
    if "No space left" in tar_err or "Disk quota exceeded" in tar_err:
        return True
    try:
        st = os.statvfs(dest)
    except OSError:
        return False
    return "Wrote only" in tar_err and st.f_bavail * st.f_frsize < (1 << 20)


def _grow_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_SIZE)
    except OSError:
        pass  # a smaller pipe only costs more system calls


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]


def relay_extract(gunzip: Gunzip, dest: Path, tar: str, vetter: TarScanner | None = None) -> TarScanner:
    """The plain tar from `gunzip` -> vetter -> GNU tar -x into `dest`; returns the vetter.

    Headers (and small members) are read into one buffer, vetted, and that buffer is written to tar.
    The data of a large member is moved from gunzip's pipe to tar's with splice(2), after its header
    was vetted and for exactly the byte count the header declared: no copy through this process, and
    the bytes tar receives are still exactly the stream the vetter walks."""
    vetter = vetter or HeaderVetter()
    untar = subprocess.Popen(
        [
            tar,
            "-x",
            "-f",
            "-",
            "-C",
            str(dest),
            "--no-same-owner",
            "--no-same-permissions",
            "--warning=no-unknown-keyword",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        bufsize=0,  # unbuffered: splice and write go to the same pipe, in order
        env={**os.environ, "LC_ALL": "C"},  # names pass byte for byte (no charset conversion)
    )
    source = cast(io.FileIO, gunzip.stdout.raw)  # never the buffered reader: splice reads the same fd
    stdin, stderr = _pipe(untar.stdin), _pipe(untar.stderr)
    fd_in, fd_out = source.fileno(), stdin.fileno()
    _grow_pipe(fd_in)
    _grow_pipe(fd_out)
    splice = getattr(os, "splice", None)
    finished = tar_gone = False
    try:
        buf = bytearray(BUFFER)
        view = memoryview(buf)
        while True:
            left = vetter.splicable
            if splice is not None and left >= SPLICE_MIN and not tar_gone:
                try:
                    moved = splice(fd_in, fd_out, min(left, 1 << 30))
                except BrokenPipeError:
                    tar_gone = True  # tar failed (disk full?); its stderr says why
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                        raise
                    splice = None  # not a pipe here: copy instead
                    continue
                if not moved:
                    break  # gunzip ended inside a member: finish() says truncated
                vetter.skip_data(moved)
                continue
            n = source.readinto(buf)
            if not n:
                break
            used = vetter.feed(view[:n])  # raises before a chunk with a refused header reaches tar
            if used and not tar_gone:
                try:
                    _write_all(fd_out, view[:used])
                except BrokenPipeError:
                    tar_gone = True
                    break
            if vetter.ended and not stdin.closed:
                stdin.close()
        finished = not tar_gone
    finally:
        if not finished and not tar_gone:
            untar.kill()
        gunzip.close(failed=not finished)
        try:
            stdin.close()
        except BrokenPipeError:
            pass
        tar_err = stderr.read(1 << 16).decode(errors="replace").strip()
        stderr.close()
        untar.wait()
    if untar.returncode != 0:
        if _disk_full(tar_err, dest):
            raise OSError(errno.ENOSPC, "No space left on device", str(dest))
        gunzip.check()
        if not vetter.ended:
            vetter.finish()  # the archive ended early: say so rather than tar's symptom
        raise ArchiveError(
            f"tar could not extract the bundle ({tar_err[-2000:] or f'exit {untar.returncode}'})"
        )
    gunzip.check()
    vetter.finish()
    return vetter
