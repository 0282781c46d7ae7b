"""One rule for every tar archive rocmdoctor unpacks: bundle archives and snapshot archives.

Three parts, used by both bundle extractors (GNU tar behind a vetter, or our own writer) and by the
snapshot unpacker:

- `TarScanner`, a push parser that accepts headers only in the canonical form that GNU tar and
  Python's tarfile read identically (octal numbers without signs, blanks or stray bytes, positive
  base-256, exact pax records with plain decimal numbers, no sparse or vendor types, a checksum
  that matches). Where two parsers could disagree about where a header starts, the one that vets and
  the one that extracts would see different members; refusing the ambiguous form closes that class.
- `MemberRule`, what a member may be: a regular file, directory, symlink or hard link with a relative
  path, no `..`, nothing below a symlink or a file, no name twice, symlinks that resolve inside the
  tree against the archive's own links (never the disk), hard links only to regular files extracted
  before them, no setuid/setgid/sticky bits, and the size, count and depth limits of the caller.
- `TreeWriter`, which creates vetted members with directory file descriptors (`O_NOFOLLOW`, `mkdir`,
  `symlink` and `link` relative to an open directory), so no path is ever resolved through a link,
  whatever the interpreter's tarfile or `realpath` would do (CVE-2025-4517 and friends).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

BLOCK = 512
BUFFER = 1 << 20
PATH_MAX = 4096
NAME_MAX = 255
ZERO_BLOCK = bytes(BLOCK)
FILE, DIR, SYMLINK, HARDLINK = "file", "dir", "symlink", "hardlink"
_KINDS = {b"0": FILE, b"5": DIR, b"2": SYMLINK, b"1": HARDLINK}
_USTAR, _GNU = b"ustar\x0000", b"ustar  \x00"
_OCTAL = re.compile(rb"[0-7]+[ \0]*")
_DECIMAL = re.compile(rb"0|[1-9][0-9]*")
_TIME = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")
_PAX_MEMBER_KEYS = {b"path", b"linkpath", b"size", b"mtime", b"atime", b"ctime", b"uid", b"gid"}
_PAX_IGNORED_KEYS = {b"uname", b"gname", b"comment"}
_PAX_IGNORED_PREFIXES = (b"SCHILY.xattr.", b"LIBARCHIVE.xattr.")
_PAX_GLOBAL_KEYS = {b"comment"}  # what `git archive` writes; anything else would apply to every member
# What GNU tar and tarfile write: mode, uid, gid, size, mtime full width and NUL-terminated, the
# checksum "%06o\0 ". One match checks them all; anything else goes through `_number` field by field.
_TYPICAL_NUMBERS = re.compile(rb"([0-7]{7})\0([0-7]{7})\0([0-7]{7})\0([0-7]{11})\0([0-7]{11})\0([0-7]{6})\0 ")
_MAX_PAX = 1 << 20
_MAX_LONGNAME = 2 * PATH_MAX
_MAX_TRAILER = 1 << 20  # zero padding after the end marker (tar pads to its record size)
_MAX_LINK_HOPS = 40  # the kernel's own limit (ELOOP)


class ArchiveError(RuntimeError):
    """The stream is not a readable tar (truncated, corrupt, not gzip)."""


class UnsafeArchive(ValueError):
    """A member (or a header) that the rule refuses."""

    def __init__(self, member: str, reason: str) -> None:
        super().__init__(f"archive member {member!r} {reason}")
        self.member = member
        self.reason = reason


class NoSpaceLeft(OSError):
    """The destination filled up during extraction (the archive itself may be fine)."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(errno.ENOSPC, message, path)
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Limits:
    """Caps a caller puts on an archive; each is checked on the header, before the member's bytes."""

    member_size: int | None = None
    members: int | None = None
    total: int | None = None
    depth: int = 64


@dataclass(slots=True)
class Member:
    name: str  # for messages
    path: tuple[bytes, ...]  # normalised components; () is the destination itself
    kind: str
    size: int
    mode: int
    mtime_ns: int
    target: bytes = b""  # symlink text, or a hard link's target path

    @property
    def key(self) -> bytes:
        return b"/".join(self.path)


def _show(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


# -- headers ------------------------------------------------------------------------------------


def _noncanonical(where: str, what: str) -> UnsafeArchive:
    return UnsafeArchive(
        where, f"has {what}; refused because tar implementations read such headers differently"
    )


def _cstr(field: bytes, what: str, where: str) -> bytes:
    """A NUL-terminated text field: after the first NUL only NULs (else parsers split it differently)."""
    end = field.find(b"\0")
    if end < 0:
        return field
    if field.count(0, end) != len(field) - end:
        raise _noncanonical(where, f"bytes after the end of its {what} field")
    return field[:end]


def _number(field: bytes, what: str, bound: int, where: str, base256: bool = False) -> int:
    if field[0] == 0x80 and base256:
        value = int.from_bytes(field[1:], "big")  # GNU and tarfile agree only on a leading 0x80
    elif _OCTAL.fullmatch(field):
        value = int(field.rstrip(b" \0"), 8)
    else:
        raise _noncanonical(where, f"a {what} field that is not a plain octal number ({field!r})")
    if value > bound:
        raise _noncanonical(where, f"an out-of-range {what} ({value})")
    return value


def _pax_records(data: bytes, where: str) -> dict[bytes, bytes]:
    """`<len> <key>=<value>\\n` records tiling `data` exactly, each length a plain decimal number."""
    records: dict[bytes, bytes] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos, pos + 21)
        text = data[pos:space] if space > pos else b""
        if not text or not _DECIMAL.fullmatch(text) or text == b"0":
            raise _noncanonical(
                where, f"a pax record length that is not a plain decimal ({data[pos : pos + 20]!r})"
            )
        end = pos + int(text)
        if end > len(data) or end <= space + 1 or data[end - 1] != 0x0A:
            raise _noncanonical(where, "a pax record whose length does not match its text")
        key, eq, value = data[space + 1 : end - 1].partition(b"=")
        if not eq or not key or b"\0" in key or b"\0" in value:
            raise _noncanonical(where, f"a malformed pax record ({data[pos:end][:60]!r})")
        if key in records:
            raise _noncanonical(where, f"the pax keyword {_show(key)!r} twice")
        records[key] = value
        pos = end
    return records


def _pax_number(value: bytes, key: bytes, bound: int, where: str) -> int:
    if not _DECIMAL.fullmatch(value) or int(value) > bound:
        raise _noncanonical(where, f"a pax {_show(key)} that is not a plain decimal number ({value!r})")
    return int(value)


def _pax_time_ns(value: bytes, key: bytes, where: str) -> int:
    if not _TIME.fullmatch(value) or len(value) > 40:
        raise _noncanonical(where, f"a pax {_show(key)} that is not a plain decimal time ({value!r})")
    whole, _, frac = value.partition(b".")
    ns = int(whole) * 1_000_000_000
    sign = -1 if value.startswith(b"-") else 1
    ns += sign * int((frac + b"000000000")[:9] or b"0")
    # os.utime takes 64-bit nanoseconds (years 1677 to 2262): a time outside is refused here, not an
    # OverflowError in the middle of an extraction
    if not -(1 << 63) <= ns < 1 << 63:
        raise _noncanonical(where, f"a pax {_show(key)} out of range ({value[:40]!r})")
    return ns


# -- the member rule -------------------------------------------------------------------------------


LinkPolicy = Callable[[bytes, bytes], bool]


class MemberRule:
    """The tree as the archive builds it, member by member; `check` refuses what must not be created."""

    def __init__(self, limits: Limits, opaque_link: LinkPolicy | None = None, what: str = "the tree") -> None:
        self.limits = limits
        self.opaque_link = opaque_link  # (path, target) -> a link kept as text only, never resolved
        self.what = what
        self.kinds: dict[bytes, str] = {}  # path -> FILE | DIR | SYMLINK | "opaque" | "implicit"
        self.links: dict[bytes, tuple[bytes, ...]] = {}
        self.members = 0
        self.total = 0
        self._last_parent: tuple[bytes, ...] | None = None  # its ancestors were checked and recorded

    def path(self, raw: bytes, name: str, is_dir: bool) -> tuple[bytes, ...]:
        if not raw:
            raise UnsafeArchive(name, "has an empty name")
        if raw.startswith(b"/"):
            raise UnsafeArchive(name, "has an absolute path")
        comps = tuple(c for c in raw.split(b"/") if c and c != b".")
        if b".." in comps:
            raise UnsafeArchive(name, "contains '..'")
        if len(raw) >= PATH_MAX or (len(raw) > NAME_MAX and any(len(c) > NAME_MAX for c in comps)):
            raise UnsafeArchive(name, f"has a name longer than the system allows ({len(raw)} bytes)")
        if len(comps) > self.limits.depth:
            raise UnsafeArchive(name, f"is nested {len(comps)} levels deep (at most {self.limits.depth})")
        if raw.endswith(b"/") and not is_dir:
            raise UnsafeArchive(name, "ends with '/' but is not a directory")
        return comps

    def check(self, m: Member) -> None:
        name, limits = m.name, self.limits
        if m.mode & 0o7000:
            raise UnsafeArchive(name, "has the setuid, setgid or sticky bit")
        if m.kind != FILE and m.size:
            raise _noncanonical(name, f"a size ({m.size}) on a {m.kind}")
        if limits.member_size is not None and m.size > limits.member_size:
            raise UnsafeArchive(
                name, f"is {human(m.size)}, more than the {human(limits.member_size)} allowed"
            )
        if limits.members is not None and self.members + 1 > limits.members:
            raise UnsafeArchive(name, f"is one member more than the {limits.members} allowed")
        if limits.total is not None and self.total + m.size > limits.total:
            raise UnsafeArchive(name, f"brings the archive past the {human(limits.total)} allowed")
        if not m.path:
            if m.kind != DIR:
                raise UnsafeArchive(name, "names the destination itself")
            return
        parent = m.path[:-1]
        fresh_parent = parent != self._last_parent  # members come grouped by directory
        if fresh_parent:
            for depth in range(1, len(m.path)):
                kind = self.kinds.get(b"/".join(m.path[:depth]))
                if kind in (SYMLINK, "opaque"):
                    raise UnsafeArchive(name, "would be written through a symlink")
                if kind in (FILE, HARDLINK):
                    raise UnsafeArchive(name, "would be written below a file")
        key = m.key
        existing = self.kinds.get(key)
        if existing is not None and not (m.kind == DIR and existing in (DIR, "implicit")):
            raise UnsafeArchive(
                name, "appears twice in the archive (a later member would replace an earlier one)"
            )
        kind = m.kind
        if m.kind == SYMLINK:
            kind = self._check_symlink(m)
        elif m.kind == HARDLINK:
            self._check_hardlink(m)
        self.members += 1
        self.total += m.size
        if fresh_parent:
            for depth in range(1, len(m.path)):
                self.kinds.setdefault(b"/".join(m.path[:depth]), "implicit")
            self._last_parent = parent
        self.kinds[key] = kind

    def _check_symlink(self, m: Member) -> str:
        target = m.target
        if not target or b"\0" in target or len(target) >= PATH_MAX:
            raise UnsafeArchive(m.name, f"is a symlink with an invalid target ({target[:60]!r})")
        if self.opaque_link is not None:
            # a tree of opaque links only (a snapshot): kept as text, never resolved, nothing else
            if self.opaque_link(m.key, target):
                return "opaque"
            raise UnsafeArchive(m.name, f"is a symlink ({_show(target)!r}) that {self.what} may not hold")
        if target.startswith(b"/"):
            raise UnsafeArchive(m.name, f"is a symlink to the absolute path {_show(target)!r}")
        if not self._resolves_inside(list(m.path[:-1]), target):
            raise UnsafeArchive(m.name, f"is a symlink leaving {self.what} ({_show(target)!r})")
        self.links[m.key] = tuple(target.split(b"/"))
        return SYMLINK

    def _resolves_inside(self, stack: list[bytes], target: bytes) -> bool:
        """Walk `target` from `stack` through the archive's own links; False if it could leave the tree.

        After a name the archive has not created yet, `..` is refused: that name could still become a
        link, which would move where `..` lands."""
        todo = list(reversed(target.split(b"/")))
        hops = 0
        unknown = False
        steps = 0
        while todo:
            steps += 1
            if steps > 64 * PATH_MAX:
                return False
            comp = todo.pop()
            if comp in (b"", b"."):
                continue
            if comp == b"..":
                if unknown or not stack:
                    return False
                stack.pop()
                continue
            stack.append(comp)
            if unknown:
                continue
            key = b"/".join(stack)
            kind = self.kinds.get(key)
            if kind is None:
                unknown = True
            elif kind == SYMLINK:
                hops += 1
                if hops > _MAX_LINK_HOPS:
                    return False
                stack.pop()
                todo.extend(reversed(self.links[key]))
            elif kind in ("opaque", FILE, HARDLINK) and todo:
                return False  # through a file or an opaque link: never resolved, never allowed
        return True

    def _check_hardlink(self, m: Member) -> None:
        target = m.target
        try:
            comps = self.path(target, m.name, is_dir=False)
        except UnsafeArchive as exc:
            raise UnsafeArchive(
                m.name, f"is a hard link leaving {self.what} ({_show(target)!r}: {exc.reason})"
            ) from None
        if self.kinds.get(b"/".join(comps)) not in (FILE, HARDLINK):
            raise UnsafeArchive(
                m.name,
                f"is a hard link to {_show(target)!r}, which is not a regular file extracted before it",
            )


# -- the scanner -----------------------------------------------------------------------------------


class Readable(Protocol):
    def readinto(self, buffer: bytearray, /) -> int | None: ...


class Sink(Protocol):
    def begin(self, member: Member) -> None: ...
    def data(self, chunk: memoryview) -> None: ...
    def end(self) -> None: ...


class TarScanner:
    """Feed it the plain tar stream in order; it parses and vets every header before returning.

    `feed` returns how many bytes of the chunk belong to the archive (up to and including the two
    zero blocks that end it); what follows must be zeros. With a `sink`, each accepted member and its
    data go there (the Python extractor); without one, data is skipped (the vetter before GNU tar)."""

    def __init__(self, rule: MemberRule, sink: Sink | None = None) -> None:
        self.rule = rule
        self.sink = sink
        self.offset = 0  # bytes of the stream consumed
        self._header = bytearray()
        self._data_left = 0  # member data still to pass to the sink / skip
        self._pad_left = 0
        self._collect: bytearray | None = None
        self._collect_kind = b""
        self._pending: dict[bytes, bytes] = {}  # extended header values for the next member
        self._pending_kinds: set[bytes] = set()
        self._in_member = False
        self.zero_blocks = 0
        self.trailer = 0
        self.members = 0

    @property
    def ended(self) -> bool:
        return self.zero_blocks >= 2

    def feed(self, data: memoryview) -> int:
        pos, size = 0, len(data)
        while pos < size:
            if self.ended:
                rest = data[pos:]
                if rest.tobytes().count(0) != len(rest):
                    raise UnsafeArchive(f"(byte {self.offset})", "is data after the end-of-archive marker")
                self.trailer += len(rest)
                self.offset += len(rest)
                if self.trailer > _MAX_TRAILER:
                    raise UnsafeArchive(
                        f"(byte {self.offset})", "is padding far past the end-of-archive marker"
                    )
                return pos
            if self._data_left:
                take = min(self._data_left, size - pos)
                chunk = data[pos : pos + take]
                if self._collect is not None:
                    self._collect += chunk
                elif self.sink is not None:
                    self.sink.data(chunk)
                self._data_left -= take
                pos += take
                self.offset += take
                if not self._data_left:
                    self._end_data()
                continue
            if self._pad_left:
                take = min(self._pad_left, size - pos)
                self._pad_left -= take
                pos += take
                self.offset += take
                continue
            take = min(BLOCK - len(self._header), size - pos)
            self._header += data[pos : pos + take]
            pos += take
            self.offset += take
            if len(self._header) == BLOCK:
                header, self._header = bytes(self._header), bytearray()
                self._on_header(header)
        return pos

    @property
    def splicable(self) -> int:
        """Bytes of member data that may pass without being looked at (no sink, not an extended header)."""
        return self._data_left if self._collect is None and self.sink is None else 0

    def skip_data(self, n: int) -> None:
        """`n` bytes of member data went to the extractor directly (spliced): account for them."""
        if n > self.splicable:
            raise ValueError(f"skip_data({n}) past the member's data ({self.splicable} left)")
        self._data_left -= n
        self.offset += n
        if not self._data_left:
            self._end_data()

    def finish(self) -> None:
        """The stream ended: it must have ended as an archive does."""
        if not self.ended:
            raise ArchiveError("the archive is truncated (no end-of-archive marker)")

    def _end_data(self) -> None:
        if self._collect is not None:
            data, self._collect = bytes(self._collect), None
            self._on_extended(data)
        elif self._in_member:
            self._in_member = False
            if self.sink is not None:
                self.sink.end()

    def _start_data(self, size: int) -> None:
        self._data_left = size
        self._pad_left = -size % BLOCK
        if not size:
            self._end_data()

    def _on_header(self, header: bytes) -> None:
        where = f"(header at byte {self.offset - BLOCK})"
        magic = header[257:265]
        if header != ZERO_BLOCK and magic not in (_USTAR, _GNU):
            raise ArchiveError(
                f"the archive is not a ustar or GNU tar stream (no tar header at byte {self.offset - BLOCK})"
            )
        if header == ZERO_BLOCK:
            if self._pending_kinds:
                raise _noncanonical(where, "an extended header that no member follows")
            self.zero_blocks += 1
            return
        if self.zero_blocks:
            raise _noncanonical(where, "a single zero block before more members (tar readers disagree on it)")
        typical = _TYPICAL_NUMBERS.fullmatch(header, 100, 156)
        if typical and int(typical.group(1), 8) <= 0o7777:
            mode, size, mtime, stored = (int(typical.group(i), 8) for i in (1, 4, 5, 6))
        else:
            stored = _number(header[148:156], "checksum", 1 << 21, where)
            mode = _number(header[100:108], "mode", 0o7777, where)
            _number(header[108:116], "uid", (1 << 32) - 1, where, base256=True)
            _number(header[116:124], "gid", (1 << 32) - 1, where, base256=True)
            size = _number(header[124:136], "size", 1 << 40, where, base256=True)
            mtime = _number(header[136:148], "mtime", 1 << 36, where, base256=True)
        if stored != sum(header) - sum(header[148:156]) + 8 * 0x20:
            raise ArchiveError(f"the archive has a header with a bad checksum at byte {self.offset - BLOCK}")
        if magic == _USTAR:
            prefix = _cstr(header[345:500], "prefix", where)
            if header[500:512].count(0) != 12:
                raise _noncanonical(where, "bytes in the unused end of a ustar header")
        else:  # GNU: incremental, sparse and multi-volume data here, which tarfile would read as a prefix
            prefix = b""
            if header[345:512].count(0) != 167:
                raise _noncanonical(where, "GNU incremental, sparse or multi-volume fields")
        name = _cstr(header[0:100], "name", where)
        if prefix:
            name = prefix + b"/" + name
        kind = header[156:157]
        linkname = _cstr(header[157:257], "link name", where)
        _cstr(header[265:297], "user name", where)
        _cstr(header[297:329], "group name", where)
        for lo in (329, 337):  # device numbers: unused here, but tarfile parses them always
            if header[lo : lo + 8].count(0) != 8:
                _number(header[lo : lo + 8], "device number", 0o7777777, where)
        if kind in (b"x", b"g", b"L", b"K"):
            self._begin_extended(kind, size, where)
            return
        if kind not in _KINDS:
            shown = _show(self._pending.get(b"path", name))
            raise UnsafeArchive(
                shown, f"is a device node, FIFO or other special file (type {kind.decode('latin-1')!r})"
            )
        self._member(name, linkname, _KINDS[kind], size, mode, mtime * 1_000_000_000, where)

    def _begin_extended(self, kind: bytes, size: int, where: str) -> None:
        if kind == b"g" and self._pending_kinds:
            raise _noncanonical(where, "a global pax header between a member's extended headers")
        if (
            kind in self._pending_kinds
            or (kind == b"x" and self._pending_kinds)
            or (kind in (b"L", b"K") and b"x" in self._pending_kinds)
        ):
            raise _noncanonical(where, "extended headers of different kinds (or twice) for one member")
        bound = _MAX_PAX if kind in (b"x", b"g") else _MAX_LONGNAME
        if size > bound:
            raise UnsafeArchive(where, f"is an extended header of {size} bytes (at most {bound})")
        if kind != b"g":
            self._pending_kinds.add(kind)
        self._collect, self._collect_kind = bytearray(), kind
        self._start_data(size)

    def _on_extended(self, data: bytes) -> None:
        kind = self._collect_kind
        where = f"(extended header before byte {self.offset})"
        if kind in (b"L", b"K"):
            if not data or data[-1] != 0 or b"\0" in data[:-1]:
                raise _noncanonical(where, "a GNU long name that is not one NUL-terminated string")
            self._pending[b"path" if kind == b"L" else b"linkpath"] = data[:-1]
            return
        records = _pax_records(data, where)
        allowed = _PAX_GLOBAL_KEYS if kind == b"g" else _PAX_MEMBER_KEYS | _PAX_IGNORED_KEYS
        for key in records:
            if key not in allowed and not key.startswith(_PAX_IGNORED_PREFIXES):
                raise UnsafeArchive(
                    where, f"has the pax keyword {_show(key)!r}, which rocmdoctor does not accept"
                )
        for key in (b"mtime", b"atime", b"ctime"):
            if key in records:
                _pax_time_ns(records[key], key, where)
        for key in (b"uid", b"gid"):
            if key in records:
                _pax_number(records[key], key, (1 << 32) - 1, where)
        if kind == b"x":
            self._pending.update(records)

    def _member(
        self, name: bytes, linkname: bytes, kind: str, size: int, mode: int, mtime_ns: int, where: str
    ) -> None:
        pending, self._pending, self._pending_kinds = self._pending, {}, set()
        name = pending.get(b"path", name)
        linkname = pending.get(b"linkpath", linkname)
        shown = _show(name) or where
        if b"\n" in name or b"\n" in linkname:
            raise UnsafeArchive(shown, "has a newline in its name or link target")
        if b"size" in pending:
            size = _pax_number(pending[b"size"], b"size", 1 << 40, shown)
        if b"mtime" in pending:
            mtime_ns = _pax_time_ns(pending[b"mtime"], b"mtime", shown)
        if kind not in (SYMLINK, HARDLINK) and linkname:
            raise _noncanonical(shown, f"a link name on a {kind}")
        path = self.rule.path(name, shown, is_dir=kind == DIR)
        member = Member(shown, path, kind, size, mode, mtime_ns, linkname)
        self.rule.check(member)
        self.members += 1
        if self.sink is not None:
            self.sink.begin(member)
        self._in_member = True
        self._start_data(size if kind == FILE else 0)


# -- the writer ------------------------------------------------------------------------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class TreeWriter:
    """Creates vetted members under `dest` through directory file descriptors; follows no link.

    Every directory on a member's path is opened with O_NOFOLLOW|O_DIRECTORY relative to its parent
    (created when missing), so a symlink or a file where a directory should be stops the member
    instead of redirecting it. Files get O_CREAT|O_EXCL|O_NOFOLLOW; modes lose setuid/setgid/sticky
    and group/other write; hard links are made only to regular files (checked with lstat)."""

    def __init__(self, dest: Path) -> None:
        self.root = os.open(dest, _DIR_FLAGS)
        self._chain: list[tuple[bytes, int]] = []  # the open directories of the last member's parent
        self._fd = -1
        self._member: Member | None = None
        self.written = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        for _, fd in self._chain:
            os.close(fd)
        self._chain = []
        os.close(self.root)

    def _open_dir(self, parent: int, comp: bytes, name: str, create: bool) -> int:
        for _ in range(2):
            try:
                return os.open(comp, _DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    raise UnsafeArchive(
                        name, f"refers to {_show(comp)!r}, which the archive did not create"
                    ) from None
                try:
                    os.mkdir(comp, 0o755, dir_fd=parent)
                except FileExistsError:
                    pass
            except (NotADirectoryError, OSError) as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                raise UnsafeArchive(name, "would be written through a symlink or below a file") from None
        raise UnsafeArchive(name, "has a parent directory that keeps disappearing")

    def _parent(self, comps: tuple[bytes, ...], name: str) -> int:
        keep = 0
        while keep < len(self._chain) and keep < len(comps) and self._chain[keep][0] == comps[keep]:
            keep += 1
        for _, fd in self._chain[keep:]:
            os.close(fd)
        del self._chain[keep:]
        fd = self._chain[-1][1] if self._chain else self.root
        for comp in comps[keep:]:
            fd = self._open_dir(fd, comp, name, create=True)
            self._chain.append((comp, fd))
        return fd

    def begin(self, m: Member) -> None:
        if not m.path:
            return
        parent = self._parent(m.path[:-1], m.name)
        leaf = m.path[-1]
        if m.kind == DIR:
            try:
                os.mkdir(leaf, 0o755, dir_fd=parent)
            except FileExistsError:
                os.close(self._open_dir(parent, leaf, m.name, create=False))
        elif m.kind == FILE:
            try:
                self._fd = os.open(leaf, _NEW_FILE, 0o600, dir_fd=parent)
            except FileExistsError:
                raise UnsafeArchive(m.name, "appears twice in the archive") from None
            self._member = m
        elif m.kind == SYMLINK:
            os.symlink(m.target, leaf, dir_fd=parent)
        else:
            self._hardlink(m, parent, leaf)

    def _hardlink(self, m: Member, parent: int, leaf: bytes) -> None:
        comps = tuple(c for c in m.target.split(b"/") if c and c != b".")
        fd = self.root
        opened: list[int] = []
        try:
            for comp in comps[:-1]:
                fd = self._open_dir(fd, comp, m.name, create=False)
                opened.append(fd)
            try:
                st = os.stat(comps[-1], dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is None or not stat.S_ISREG(st.st_mode):
                raise UnsafeArchive(
                    m.name, f"is a hard link to {_show(m.target)!r}, which is not a regular file"
                )
            os.link(comps[-1], leaf, src_dir_fd=fd, dst_dir_fd=parent, follow_symlinks=False)
        finally:
            for each in opened:
                os.close(each)

    def data(self, chunk: memoryview) -> None:
        while chunk:
            n = os.write(self._fd, chunk)
            self.written += n
            chunk = chunk[n:]

    def end(self) -> None:
        if self._fd < 0 or self._member is None:
            return
        m, fd = self._member, self._fd
        self._fd, self._member = -1, None
        try:
            os.fchmod(fd, (m.mode & 0o755) | 0o600)
            os.utime(fd, ns=(m.mtime_ns, m.mtime_ns))
        finally:
            os.close(fd)


def extract_tar(reader: Readable, dest: Path, rule: MemberRule) -> TreeWriter:
    """Read a plain tar stream from `reader` and create its members under `dest` (an empty directory).

    Raises UnsafeArchive / ArchiveError before anything refused is created; the caller removes
    `dest` on failure. Returns the writer (for `written`)."""
    writer = TreeWriter(dest)
    scanner = TarScanner(rule, writer)
    buf = bytearray(BUFFER)
    view = memoryview(buf)
    try:
        while n := reader.readinto(buf):
            scanner.feed(view[:n])
        scanner.finish()
    finally:
        writer.close()
    return writer


# -- disk full -------------------------------------------------------------------------------------


def _mount_of(path: Path) -> tuple[str, str]:
    """(mount point, filesystem source) holding `path`, for a message; best effort."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        dev = probe.stat().st_dev
        while probe != probe.parent and probe.parent.stat().st_dev == dev:
            probe = probe.parent
    except OSError:
        return str(path), ""
    source = ""
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as fh:
            for line in fh.read(1 << 20).splitlines():
                fields = line.split()
                if len(fields) > 2 and fields[1] == str(probe):
                    source = fields[0]
    except OSError:
        pass
    return str(probe), source


def no_space(dest: Path, written: int, needed: int | None) -> NoSpaceLeft:
    """The disk-full message: where, how much was needed (estimated), how much is free."""
    mount, source = _mount_of(dest)
    try:
        st = os.statvfs(mount)
        free = st.f_bavail * st.f_frsize
    except OSError:
        free = 0
    device = f"{source} at {mount}" if source else mount
    need = f"needed ~{human(needed)}" if needed and needed > written else f"needed more than {human(written)}"
    return NoSpaceLeft(
        f"no space left on {device} (extracting into {dest}): {need}, free {human(free)} "
        f"after {human(written)} written. Free space there (or choose another location) and rerun",
        str(dest),
    )


def is_no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
