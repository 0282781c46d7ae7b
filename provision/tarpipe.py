"""Fast extraction: `pigz -dc | <vet> | tar -x`, where <vet> is this module reading every tar header
before GNU tar may see it.

The relay parses each header (ustar, GNU long names, pax `path`/`linkpath`/`size`), applies the same
rules as the Python extractor (no absolute names, no `..`, no links leaving the tree, only regular
files, directories and links, no setuid/setgid) and forwards a block to tar only once every header
in it has passed. Symlinks are resolved against the archive's own symlinks (tar lags behind us, so
the disk cannot be asked). GNU tar adds its own guards (it also refuses `..` and strips a leading
`/`). Anything the parser does not understand is refused, never passed through.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from .extract import BUFFER, ArchiveError, UnsafeArchive

if TYPE_CHECKING:
    from .extract import Gunzip

BLOCK = 512
_REGULAR = (b"0", b"\0", b"7")
_HARD, _SYM = b"1", b"2"
_PAX_RECORD = re.compile(rb"(\d+) ")


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


def _number(field: bytes, what: str) -> int:
    if field[:1] and field[0] & 0x80:  # GNU base-256
        value = int.from_bytes(field[1:], "big")
        return -value if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise ArchiveError(f"the bundle archive has a corrupt header ({what} field {text!r})") from None


def _text(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax(data: bytes) -> dict[str, str]:
    records: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos : pos + 1] != b"\0":
        match = _PAX_RECORD.match(data, pos)
        if not match:
            raise ArchiveError("the bundle archive has a corrupt pax header")
        length = int(match.group(1))
        record = data[match.end() : pos + length]
        if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
            raise ArchiveError("the bundle archive has a corrupt pax header")
        key, value = record[:-1].split(b"=", 1)
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


class _SymlinkMap:
    """The archive's symlinks, to resolve paths the way the finished tree will."""

    def __init__(self) -> None:
        self.links: dict[str, str] = {}

    def inside(self, path: str) -> bool:
        """True if `path` (relative to the tree) resolves inside the tree."""
        stack: list[str] = []
        todo = [c for c in path.split("/") if c]
        hops = 0
        while todo:
            part = todo.pop(0)
            if part == ".":
                continue
            if part == "..":
                if not stack:
                    return False
                stack.pop()
                continue
            stack.append(part)
            target = self.links.get("/".join(stack))
            if target is not None:
                hops += 1
                if hops > 40 or target.startswith("/"):
                    return False
                stack.pop()
                todo = [c for c in target.split("/") if c] + todo
        return True


class HeaderVetter:
    """Feed it the decompressed tar stream in order; it raises before an unsafe member gets through."""

    def __init__(self) -> None:
        self._header = bytearray()
        self._skip = 0  # data bytes (incl. padding) of the current member still to pass
        self._collect: bytearray | None = None  # data of a pax / GNU long-name header being read
        self._collect_kind = b""
        self._collect_size = 0
        self._long_name: str | None = None
        self._long_link: str | None = None
        self._pax: dict[str, str] = {}
        self.ended = False
        self.symlinks = _SymlinkMap()
        self.members = 0

    def feed(self, data: memoryview) -> int:
        """Vet `data`; returns how many of its bytes belong to the archive (up to its end marker)."""
        pos, size = 0, len(data)
        while pos < size and not self.ended:
            if self._skip:
                take = min(self._skip, size - pos)
                if self._collect is not None:
                    self._collect += data[pos : pos + take]
                self._skip -= take
                pos += take
                if not self._skip and self._collect is not None:
                    self._finish_collect()
                continue
            take = min(BLOCK - len(self._header), size - pos)
            self._header += data[pos : pos + take]
            pos += take
            if len(self._header) == BLOCK:
                header, self._header = bytes(self._header), bytearray()
                self._on_header(header)
        return pos

    def _finish_collect(self) -> None:
        data, kind = bytes(self._collect or b""), self._collect_kind
        self._collect = None
        if kind == b"x":
            self._pax.update(_pax(data[: self._collect_size]))
        elif kind == b"g":
            if {"path", "linkpath"} & set(_pax(data[: self._collect_size])):
                raise UnsafeArchive("(global pax header)", "sets a path for every member")
        elif kind == b"L":
            self._long_name = data[: self._collect_size].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif kind == b"K":
            self._long_link = data[: self._collect_size].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")

    def _on_header(self, header: bytes) -> None:
        if header == bytes(BLOCK):
            self.ended = True  # tar's end-of-archive marker; what follows is padding
            return
        stored = _number(header[148:156], "checksum")
        unsigned = sum(header[:148]) + 256 + sum(header[156:])
        signed = unsigned - 2 * sum(b for b in header[:148] + header[156:] if b > 127)
        if stored not in (unsigned, signed):
            raise ArchiveError("the bundle archive has a header with a bad checksum (corrupt download?)")
        kind = header[156:157] or b"0"
        size = _number(header[124:136], "size")
        if kind in (b"x", b"g", b"L", b"K"):
            if size > (1 << 20):
                raise UnsafeArchive("(extended header)", f"is implausibly large ({size} bytes)")
            self._collect, self._collect_kind, self._collect_size = bytearray(), kind, size
            self._skip = -(-size // BLOCK) * BLOCK
            if not self._skip:
                self._finish_collect()
            return
        name = _text(header[0:100])
        if header[257:263] == b"ustar\x00" and header[345:500].strip(b"\0"):
            name = _text(header[345:500]) + "/" + name
        linkname = _text(header[157:257])
        name = self._pax.get("path", self._long_name or name)
        linkname = self._pax.get("linkpath", self._long_link or linkname)
        if "size" in self._pax:
            size = int(self._pax["size"])
        sparse = any(k.startswith("GNU.sparse") for k in self._pax)
        self._pax, self._long_name, self._long_link = {}, None, None
        mode = _number(header[100:108], "mode")
        self._check(name, kind, linkname, mode, sparse)
        self.members += 1
        self._skip = -(-size // BLOCK) * BLOCK if kind in _REGULAR else 0

    def _check(self, name: str, kind: bytes, linkname: str, mode: int, sparse: bool) -> None:
        if not name or "\0" in name:
            raise UnsafeArchive(name, "has an empty name")
        if name.startswith("/"):
            raise UnsafeArchive(name, "has an absolute path")
        clean = name.rstrip("/")
        if ".." in clean.split("/"):
            raise UnsafeArchive(name, "contains '..'")
        if kind not in (*_REGULAR, _HARD, _SYM, b"5") or sparse:
            raise UnsafeArchive(
                name, f"is a device node, FIFO or other special file (type {kind.decode(errors='replace')!r})"
            )
        if mode & (stat.S_ISUID | stat.S_ISGID):
            raise UnsafeArchive(name, "has the setuid or setgid bit")
        # a later member with the same name replaces an earlier symlink
        self.symlinks.links.pop(os.path.normpath(clean), None)
        if kind == _SYM:
            if linkname.startswith("/"):
                raise UnsafeArchive(name, f"is a symlink to the absolute path {linkname!r}")
            parent = os.path.dirname(clean)
            if not self.symlinks.inside(parent) or not self.symlinks.inside(f"{parent}/{linkname}"):
                raise UnsafeArchive(name, f"is a symlink leaving the bundle ({linkname!r})")
            self.symlinks.links[os.path.normpath(clean)] = linkname
        elif kind == _HARD:
            if linkname.startswith("/") or ".." in linkname.split("/") or not self.symlinks.inside(linkname):
                raise UnsafeArchive(name, f"is a hard link leaving the bundle ({linkname!r})")
        elif not self.symlinks.inside(os.path.dirname(clean)):
            raise UnsafeArchive(name, "would be written through a symlink leaving the bundle")


def relay_extract(gunzip: Gunzip, dest: Path, tar: str) -> None:
    """The plain tar from `gunzip` -> HeaderVetter -> GNU tar -x into `dest`."""
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
    )
    vetter = HeaderVetter()
    finished = False
    try:
        buf = bytearray(BUFFER)
        view = memoryview(buf)
        while n := gunzip.stdout.readinto(buf):
            if vetter.ended:
                continue  # padding after the end marker: drained so gunzip can verify the stream
            used = vetter.feed(view[:n])
            try:
                untar.stdin.write(view[:used])
            except BrokenPipeError:
                break
            if vetter.ended:
                untar.stdin.close()
        finished = True
    finally:
        if not finished:
            untar.kill()
        gunzip.close(failed=not finished)
        try:
            untar.stdin.close()
        except BrokenPipeError:
            pass
        tar_err = untar.stderr.read().decode(errors="replace").strip()
        untar.stderr.close()
        untar.wait()
    gunzip.check()
    if not vetter.ended:
        raise ArchiveError("the bundle archive is truncated (no end-of-archive marker)")
    if untar.returncode != 0:
        if "No space left" in tar_err:
            raise OSError(errno.ENOSPC, "No space left on device", str(dest))
        raise ArchiveError(f"tar could not extract the bundle ({tar_err or f'exit {untar.returncode}'})")
