"""`rocmdoctor snapshot`: the files the checks declare in `reads`, packed so that `--root` replays them.

Everything is read through the Host (so a snapshot of a fixture or of another snapshot works the
same way). What a tree cannot carry goes to `.rocmdoctor/`: device nodes and free space in
stat.json, the invoking identity, and only the environment variables the checks name. Secrets stay
out: /etc/passwd and /etc/group keep only the lines of the users concerned, and a process's
command line is kept only when the check reports that process (with secret flags redacted).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocmdoctor.archive.tar_rule import (
    ArchiveError,
    Limits,
    MemberRule,
    Readable,
    UnsafeArchive,
    extract_tar,
    is_no_space,
    no_space,
)
from rocmdoctor.host import DEFAULT_READ_LIMIT, ENV_FILE, IDENTITY_FILE, META_DIR, STAT_FILE, Host, ReadState
from rocmdoctor.litter import REPLAY_PREFIX
from rocmdoctor.registry import CheckSpec, Context
from rocmdoctor.sensitive import redact_cmdline, redact_env
from rocmdoctor.textnum import is_decimal

PASSWD, GROUP = "/etc/passwd", "/etc/group"
MEMBER_LIMIT = DEFAULT_READ_LIMIT  # a snapshot file is at most what one read of the Host returns
MODULE_FILE = re.compile(r"\.ko(\.[a-z]+)?$")


@dataclass(frozen=True)
class CaptureFacts:
    """What only the diagnosis knows, handed in by the caller (the core never imports checks):
    which processes the checks report, the accounts' primary groups, where free space is measured,
    and how a command line is cleaned of secrets."""

    reported_pids: frozenset[int]
    account_gids: frozenset[int]
    measured_paths: tuple[str, ...]
    redact: Callable[[str], str]
    # What a real run of the checks, with the user's options, read (Host.accessed): a prefix, a user,
    # a port other than the defaults are captured as the run read them, so replay equals live.
    read_paths: frozenset[str] = frozenset()


@dataclass
class Snapshot:
    files: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    stat: dict[str, dict[str, Any]] = field(default_factory=dict)
    identity: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def meta(self) -> dict[str, bytes]:
        return {
            f"{META_DIR}/{STAT_FILE}": _json(self.stat),
            f"{META_DIR}/{IDENTITY_FILE}": _json(self.identity),
            f"{META_DIR}/{ENV_FILE}": _json(self.env),
        }


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


def snapshot_users(ctx: Context) -> set[str]:
    identity = ctx.host.identity()
    names = {identity.user} if identity else set()
    if ctx.options.user:
        names.add(ctx.options.user)
    return names


def _filter_passwd(text: str, users: set[str]) -> str:
    return "".join(
        line + "\n"
        for line in text.splitlines()
        if line.split(":", 1)[0] in users or line.split(":")[2:3] == ["0"]
    )


def _filter_group(text: str, users: set[str], gids: set[int], keep_gids: set[int]) -> str:
    """Group lines naming one of `users`, or whose gid is a user's primary group or a device's;
    member lists cut down to `users`."""
    out = []
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) < 4 or not is_decimal(parts[2]):
            continue
        members = [m for m in parts[3].split(",") if m.strip() in users]
        if members or int(parts[2]) in gids | keep_gids:
            out.append(":".join([parts[0], parts[1], parts[2], ",".join(members)]))
    return "".join(line + "\n" for line in out)


def _capture(host: Host, snap: Snapshot, path: str, redact: Callable[[str], str]) -> None:
    """One host path into the snapshot: device node, directory, fd link or file contents."""
    if path in snap.files or path in snap.links or path in snap.dirs or path in snap.stat:
        return
    if host.deny_listed(path):  # a run may have asked for it (and been refused): never read it here
        return
    st = host.stat(path)
    if path.startswith("/dev/"):
        if st is not None:
            snap.stat[path] = st.to_json()
            acl = host.acl(path)  # udev's uaccess grants arrive as ACL entries (access.devices)
            if acl.ok:
                snap.stat[path]["acl"] = acl.value
    elif st is not None and st.type == "dir":
        snap.dirs.add(path)
    elif st is not None and st.type == "link" and _link_replays(host, path):
        # fd links, and a device's driver link (its name is the driver: gpu.mixed_vendor)
        snap.links[path] = host.readlink(path).value
    elif MODULE_FILE.search(path):
        snap.files[path] = b""  # checks test that a module file exists; its bytes stay out
    else:
        raw = host.read_text(path)
        if raw.state is ReadState.EMPTY:
            snap.files[path] = b""
        elif raw.ok:
            text = raw.value
            if path.endswith("/cmdline"):
                text = redact_cmdline(text)
            # A binary file read as text grows (U+FFFD is 3 bytes): keep what replay accepts.
            snap.files[path] = text.encode()[:MEMBER_LIMIT]


def _link_replays(host: Host, path: str) -> bool:
    """Keep a link as a link only where replay accepts one; any other link is captured by content."""
    target = host.readlink(path)
    return target.ok and replay_keeps_link(path.lstrip("/").encode(), str(target.value).encode())


def collect(ctx: Context, specs: list[CheckSpec], facts: CaptureFacts) -> Snapshot:
    host = ctx.host
    snap = Snapshot()
    users = snapshot_users(ctx)
    # The declared reads (a check's documentation, and a lint against what it reads) and what the run
    # really read: the same paths on the fixtures, and the run's wherever an option moved a read.
    declared = [p for spec in specs for p in spec.reads]
    for pattern in dict.fromkeys([*declared, *sorted(facts.read_paths)]):
        for path in host.glob(pattern):
            if (
                path.startswith("/proc/")
                and path.endswith("/cmdline")
                and path.split("/")[2].isdigit()  # /proc/cmdline is the kernel's, not a process's
                and int(path.split("/")[2]) not in facts.reported_pids
            ):
                continue
            _capture(host, snap, path, facts.redact)
    _through_kept_links(snap)
    device_gids = {entry["gid"] for entry in snap.stat.values() if "gid" in entry}
    if PASSWD in snap.files:
        snap.files[PASSWD] = _filter_passwd(snap.files[PASSWD].decode(), users).encode()
    if GROUP in snap.files:
        snap.files[GROUP] = _filter_group(
            snap.files[GROUP].decode(), users, set(facts.account_gids), device_gids
        ).encode()
    for path in facts.measured_paths:
        free = host.free_bytes(path)
        if free is not None:
            snap.stat[path] = {"type": "dir", "mode": "0755", "uid": 0, "gid": 0, "free_bytes": free}
    identity = host.identity()
    snap.identity = identity.to_json() if identity else None
    names = sorted({n for spec in specs for n in spec.env})
    snap.env = redact_env({n: host.env[n] for n in names if n in host.env})
    return snap


def _add(tar: tarfile.TarFile, name: str, kind: bytes, data: bytes = b"", target: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.type = kind
    if kind == tarfile.DIRTYPE:
        info.mode = 0o755
        tar.addfile(info)
    elif kind == tarfile.SYMTYPE:
        info.linkname = target
        tar.addfile(info)
    else:
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))


def write_archive(snap: Snapshot, out: Path) -> None:
    """A .tar.gz of the tree, written atomically (temp file in the same directory, fsync, rename)."""
    from rocmdoctor.host_writes import HostWriter

    trees = HostWriter().trees  # --output is this machine's path, whatever --root is read
    with trees.atomic_file(out.resolve()) as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        parents = {str(Path(p).parent) for p in [*snap.files, *snap.links, *snap.dirs]}
        all_dirs = set(snap.dirs)
        for parent in parents:
            while parent not in ("/", ""):
                all_dirs.add(parent)
                parent = str(Path(parent).parent)
        for path in sorted(all_dirs):
            _add(tar, path.lstrip("/"), tarfile.DIRTYPE)
        for path, data in sorted(snap.files.items()):
            _add(tar, path.lstrip("/"), tarfile.REGTYPE, data)
        for path, target in sorted(snap.links.items()):
            _add(tar, path.lstrip("/"), tarfile.SYMTYPE, target=target)
        _add(tar, META_DIR, tarfile.DIRTYPE)
        for name, data in snap.meta().items():
            _add(tar, name, tarfile.REGTYPE, data)


def snapshot(ctx: Context, specs: list[CheckSpec], facts: CaptureFacts, out: Path) -> Snapshot:
    snap = collect(ctx, specs, facts)
    write_archive(snap, out)
    return snap


# A snapshot member is at most what a capture reads of one file (host.read_text's limit); the other
# caps bound what a crafted archive can make us write before the first check runs.
SNAPSHOT_LIMITS = Limits(member_size=MEMBER_LIMIT, members=200_000, total=256 << 20, depth=32)


def replay_keeps_link(path: bytes, target: bytes) -> bool:
    """The links a snapshot may hold, as text only: under proc/ (what a process holds open), with an
    absolute target or a single name (`socket:[123]`), and a PCI device's `driver` link under sys/
    (its last name is the driver). The Host reads their text and resolves paths inside the root;
    nothing is ever extracted below one. Any other link is captured by its content instead."""
    if not target or b"\0" in target or b"\n" in target:
        return False
    if path.startswith(b"sys/") and path.endswith(b"/driver"):
        return True
    if not path.startswith(b"proc/"):
        return stays_below(target)
    return target.startswith(b"/") or (b"/" not in target and target not in (b".", b".."))


def stays_below(target: bytes) -> bool:
    """A relative link to names below its own directory (`current -> bundles/<tag>`): read as text by
    the checks, and whatever a run read through it is captured where it really is."""
    parts = target.split(b"/")
    return not target.startswith(b"/") and all(p not in (b"", b".", b"..") for p in parts)


def _through_kept_links(snap: Snapshot) -> None:
    """A file read through a kept link (`<prefix>/current/meta.json`) is stored where the link points
    (`<prefix>/bundles/<tag>/meta.json`): nothing is extracted below a link."""
    kept = {
        link: str(Path(link).parent / target)
        for link, target in snap.links.items()
        if not link.startswith("/proc/") and stays_below(target.encode())
    }
    if not kept:
        return

    def moved(path: str) -> str:
        for link, real in kept.items():
            if path.startswith(link + "/"):
                return real + path[len(link) :]
        return path

    snap.files = {moved(p): data for p, data in snap.files.items()}
    snap.dirs = {moved(p) for p in snap.dirs if p not in kept}
    snap.links = {moved(p) if p not in kept else p: t for p, t in snap.links.items()}
    snap.stat = {moved(p): entry for p, entry in snap.stat.items()}


class SnapshotError(ValueError):
    """The archive given to --root is not a readable, safe snapshot."""


def _open_plain(raw: io.BufferedReader) -> Readable:
    """The tar stream of a .tar.gz (or of a plain .tar)."""
    magic = raw.peek(2)[:2]
    return gzip.GzipFile(fileobj=raw, mode="rb") if magic == b"\x1f\x8b" else raw


def unpack(archive: Path) -> Path:
    """Extract a snapshot archive into a private temporary directory removed at exit.

    The same rule and writer as bundle extraction (`safe_tar`), with a snapshot's limits: every
    member's size, the count, the total and the depth are checked on its header, before its bytes."""
    import atexit

    from rocmdoctor.atomic import sweep
    from rocmdoctor.host_writes import HostWriter

    trees = HostWriter().trees  # the private directory is this machine's, whatever --root is read
    tmp = Path(tempfile.gettempdir())
    sweep(tmp, REPLAY_PREFIX)  # trees of replays that were killed (their owner pid is gone)
    dest = Path(tempfile.mkdtemp(prefix=f"{REPLAY_PREFIX}{os.getpid()}-", dir=tmp))
    atexit.register(trees.remove_tree, dest, ignore_errors=True)
    rule = MemberRule(SNAPSHOT_LIMITS, opaque_link=replay_keeps_link, what="a snapshot")
    try:
        with open(archive, "rb") as raw:
            extract_tar(_open_plain(raw), dest, rule)
    except UnsafeArchive as exc:
        trees.remove_tree(dest, ignore_errors=True)
        raise SnapshotError(f"{archive}: refusing unsafe member {exc.member!r}: {exc.reason}") from None
    except OSError as exc:
        trees.remove_tree(dest, ignore_errors=True)
        if is_no_space(exc):
            raise SnapshotError(f"{archive}: {no_space(dest.parent, 0, rule.total)}") from None
        if isinstance(exc, gzip.BadGzipFile):
            raise SnapshotError(f"{archive} is not a readable snapshot archive ({exc})") from None
        raise SnapshotError(f"{archive} could not be read ({exc.strerror or exc})") from None
    except (ArchiveError, EOFError, zlib.error) as exc:
        trees.remove_tree(dest, ignore_errors=True)
        raise SnapshotError(f"{archive} is not a readable snapshot archive ({exc})") from None
    if not (dest / META_DIR).is_dir() or (dest / META_DIR).is_symlink():
        raise SnapshotError(f"{archive} has no {META_DIR}/ folder: not made by `rocmdoctor snapshot`")
    return dest
