"""The one object that reads the host.

Every read of sysfs, procfs, /dev, /etc, the process table and the environment goes through
`Host`, bound to a root. With root "/" it reads this machine; with any other root it replays a
captured tree (a fixture or a `rocmdoctor snapshot`), and what a tree of plain files cannot carry
(device nodes, owners, modes, free space, the invoking identity, the environment) comes from
`<root>/.rocmdoctor/*.json`.

Reads never raise: they return a `Read` whose state says why a value is absent, so a check can
tell "missing" (load the driver) from "denied" (run as another user) from "unreadable".
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import signal
import stat as stat_mod
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from rocmdoctor.rootfs import read_regular, resolve_inside
from rocmdoctor.textnum import is_decimal

META_DIR = ".rocmdoctor"
STAT_FILE = "stat.json"
IDENTITY_FILE = "identity.json"
ENV_FILE = "env.json"

DEFAULT_READ_LIMIT = 1 << 20
# stat.json of a large snapshot holds a few thousand entries; nothing legitimate comes near this.
META_READ_LIMIT = 16 << 20
# An os-release is a few hundred bytes; a larger one is parsed leniently and only this far.
OS_RELEASE_LIMIT = 64 * 1024

# Reading these blocks forever or has side effects; no check may touch them.
FORBIDDEN_PATTERNS = (
    "/sys/kernel/debug/tracing/trace_pipe",
    "/sys/kernel/tracing/trace_pipe",
    "/sys/kernel/debug/dri/*/amdgpu_ring_*",
    "/sys/kernel/debug/dri/*/amdgpu_regs*",
    "/proc/kmsg",
    "/dev/*",
)


class ReadState(str, Enum):
    OK = "ok"
    MISSING = "missing"
    DENIED = "denied"
    UNREADABLE = "unreadable"
    EMPTY = "empty"


@dataclass(frozen=True, slots=True)
class Read:
    path: str
    state: ReadState
    value: Any = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.state is ReadState.OK

    def describe(self) -> str:
        """A short phrase for a report: why this path gave no value."""
        if self.ok:
            return f"{self.path} read"
        phrase = {
            ReadState.MISSING: "does not exist",
            ReadState.DENIED: "cannot be read as this user",
            ReadState.UNREADABLE: "could not be read",
            ReadState.EMPTY: "is empty",
        }[self.state]
        return f"{self.path} {phrase}" + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True, slots=True)
class StatInfo:
    path: str
    type: str  # "char", "block", "dir", "file", "link", "fifo", "socket"
    mode: int  # permission bits only
    uid: int
    gid: int
    rdev: str = ""  # "major:minor" for device nodes

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.type,
            "mode": f"{self.mode:04o}",
            "uid": self.uid,
            "gid": self.gid,
        }
        if self.rdev:
            out["rdev"] = self.rdev
        return out


@dataclass(frozen=True, slots=True)
class Identity:
    """Who is asking: the invoking user and the groups its processes carry right now."""

    user: str
    uid: int
    gid: int
    process_gids: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"user": self.user, "uid": self.uid, "gid": self.gid, "process_gids": list(self.process_gids)}


@dataclass(frozen=True, slots=True)
class RunResult:
    argv: tuple[str, ...]
    returncode: int | None  # None: timed out or could not start
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    spawn_error: str = ""
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class RootError(ValueError):
    """The root given to Host is not a directory."""


def _natural_key(name: str) -> list[Any]:
    # (kind, value) pairs: a number too long for int() stays text, and int never meets str in a compare
    return [(0, int(part), "") if is_decimal(part) else (1, 0, part) for part in re.split(r"([0-9]+)", name)]


def natural_sorted(names: Iterable[str]) -> list[str]:
    """card2 before card10: sysfs names sort by their numbers, not as text."""
    return sorted(names, key=_natural_key)


_FILE_TYPES = (
    (stat_mod.S_ISCHR, "char"),
    (stat_mod.S_ISBLK, "block"),
    (stat_mod.S_ISDIR, "dir"),
    (stat_mod.S_ISLNK, "link"),
    (stat_mod.S_ISFIFO, "fifo"),
    (stat_mod.S_ISSOCK, "socket"),
    (stat_mod.S_ISREG, "file"),
)


def _file_type(st_mode: int) -> str:
    return next((name for test, name in _FILE_TYPES if test(st_mode)), "file")


_ACL_TAGS = {0x01: "user", 0x02: "user", 0x04: "group", 0x08: "group", 0x10: "mask", 0x20: "other"}


def parse_posix_acl(raw: bytes) -> list[str]:
    """The kernel's system.posix_acl_access value (version 2, then 8-byte tag/perm/id entries)."""
    import struct

    entries: list[str] = []
    if len(raw) < 4 or struct.unpack_from("<I", raw)[0] != 2:
        return entries
    for offset in range(4, len(raw) - 7, 8):
        tag, perm, ident = struct.unpack_from("<HHI", raw, offset)
        name = _ACL_TAGS.get(tag)
        if name is None:
            continue
        qualifier = str(ident) if tag in (0x02, 0x08) else ""
        mode = "".join(ch if perm & bit else "-" for ch, bit in (("r", 4), ("w", 2), ("x", 1)))
        entries.append(f"{name}:{qualifier}:{mode}")
    return entries


_SLASH = Path("/")


@dataclass
class Host:
    """A view of one machine through a root directory."""

    root: Path = Path("/")
    accessed: set[str] = field(default_factory=set, repr=False)
    # Host path -> why: reads refused by permissions, so a check never mistakes one for an absence.
    denied: dict[str, str] = field(default_factory=dict, repr=False)
    _meta_cache: dict[str, Any] = field(default_factory=dict, repr=False)
    _dirs: dict[str, str] = field(default_factory=dict, repr=False)  # host dir -> its file under the root

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if not self.root.is_dir():
            raise RootError(f"--root {self.root} is not a directory")
        self.root = self.root.resolve()

    @property
    def _nofollow(self) -> int:
        """On a captured root every link was already resolved inside it; the last step opens no link."""
        return 0 if self.is_live else os.O_NOFOLLOW

    @property
    def is_live(self) -> bool:
        """True when this reads the running machine rather than a captured tree."""
        return self.root == _SLASH  # one Path, not one per read (it is asked on every read)

    # -- paths ---------------------------------------------------------------------------

    def _real(self, path: str) -> str:
        """Map a host path ('/sys/class/kfd') to the file under the root, lexically (no link followed)."""
        if not path.startswith("/"):
            raise ValueError(f"host paths are absolute: {path!r}")
        norm = os.path.normpath(path)
        if norm.startswith("//"):
            norm = norm[1:]
        if self.is_live:
            return norm
        return str(self.root) + norm

    def _inside(self, path: str, follow_last: bool = True) -> str | None:
        """The file a host path names, its links followed inside the root only; None on a link loop.

        A captured tree is untrusted input: a link in it is resolved as inside a chroot (absolute
        targets re-rooted, `..` clamped at the root), so no read ever leaves the root."""
        if not path.startswith("/"):
            raise ValueError(f"host paths are absolute: {path!r}")
        if self.is_live:
            return os.path.normpath(path)
        root = str(self.root)
        parent, _, name = path.rpartition("/")
        if not parent or not name or "/." in path or "//" in path:
            return resolve_inside(root, path, follow_last)
        # The directory is resolved once per run (a replayed tree does not change under a run): reading
        # N files of one directory walks its components once, not N times (10^4 KFD nodes, ~14 reads each).
        base = self._dirs.get(parent)
        if base is None:
            base = resolve_inside(root, parent, True)
            if base is None:
                return None
            base = base.rstrip("/")
            self._dirs[parent] = base
        candidate = f"{base}/{name}"
        if not follow_last:
            return candidate
        try:
            is_link = stat_mod.S_ISLNK(os.lstat(candidate).st_mode)
        except OSError:
            return candidate  # absent: taken literally, as resolve_inside does
        return resolve_inside(root, path, follow_last) if is_link else candidate

    def _guard(self, path: str) -> None:
        for pattern in FORBIDDEN_PATTERNS:
            if pattern == "/dev/*" and path.startswith("/dev/"):
                raise PermissionError(f"{path}: device nodes are stat'ed, never read")
            if fnmatch.fnmatchcase(path, pattern):
                raise PermissionError(f"{path} is on the deny list (reading it blocks or has side effects)")

    def unknowable(self, path: str) -> str | None:
        """Why this user cannot tell whether `path` exists (a read refused by permissions on it, on a
        directory above it, or on the captured device table), or None when an answer is trustworthy."""
        if not self.is_live and path.startswith("/dev/"):
            table = f"/{META_DIR}/{STAT_FILE}"
            self._stat_meta()
            if table in self.denied:
                return f"{self.root}{table} ({self.denied[table]})"
        for seen, why in self.denied.items():
            if path == seen or path.startswith(seen.rstrip("/") + "/"):
                return f"{seen} ({why})"
        return None

    def deny_listed(self, path: str) -> bool:
        """On the deny list: never read (device nodes are stat'ed, never read)."""
        try:
            self._guard(path)
        except PermissionError:
            return not path.startswith("/dev/")
        return False

    def _note(self, path: str) -> None:
        self.accessed.add(os.path.normpath(path))

    # -- reads ---------------------------------------------------------------------------

    def _open(self, path: str, follow_last: bool = True) -> int | Read:
        """A descriptor of the file `path` names inside the root, opened to read without blocking, or
        the Read that says why not (a denial is recorded in `denied`: unreadable is not absent). With
        `follow_last` off, a link as the last component is not followed, on a live root too."""
        self._note(path)
        self._guard(path)
        real = self._inside(path, follow_last=follow_last)
        if real is None:
            return Read(path, ReadState.UNREADABLE, detail="too many levels of symbolic links")
        nofollow = self._nofollow if follow_last else os.O_NOFOLLOW
        try:
            return os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | nofollow)
        except (FileNotFoundError, NotADirectoryError):
            return Read(path, ReadState.MISSING)
        except PermissionError as exc:
            if exc.errno == errno.ELOOP:
                return Read(path, ReadState.UNREADABLE, detail="a link changed while it was read")
            self.denied[os.path.normpath(path)] = exc.strerror or "permission denied"
            return Read(path, ReadState.DENIED, detail=exc.strerror or "")
        except OSError as exc:
            return Read(path, ReadState.UNREADABLE, detail=exc.strerror or str(exc))

    def read_text(self, path: str, limit: int = DEFAULT_READ_LIMIT) -> Read:
        """Read a file as text without trusting st_size and without blocking on sysfs quirks."""
        fd = self._open(path)
        if isinstance(fd, Read):
            return fd
        chunks: list[bytes] = []
        size = 0
        try:
            while size < limit:
                chunk = os.read(fd, min(65536, limit - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except IsADirectoryError:
            return Read(path, ReadState.UNREADABLE, detail="is a directory")
        except OSError as exc:
            # EAGAIN from broken hwmon drivers, ENODATA from absent optional attributes.
            state = ReadState.DENIED if exc.errno in (errno.EACCES, errno.EPERM) else ReadState.UNREADABLE
            return Read(path, state, detail=exc.strerror or str(exc))
        finally:
            os.close(fd)
        data = b"".join(chunks)
        if not data.strip(b"\x00 \n\t"):
            return Read(path, ReadState.EMPTY)
        return Read(path, ReadState.OK, data.decode("utf-8", errors="replace"))

    def read_int(self, path: str) -> Read:
        """An integer file (decimal, or 0x-prefixed hex as sysfs prints ids)."""
        raw = self.read_text(path, limit=4096)
        if not raw.ok:
            return raw
        text = raw.value.strip().split()[0] if raw.value.strip() else ""
        try:
            value = int(text, 0) if text.lower().startswith("0x") else int(text)
        except ValueError:
            return Read(path, ReadState.UNREADABLE, detail=f"not an integer: {text[:40]!r}")
        return Read(path, ReadState.OK, value)

    def read_json_meta(self, name: str) -> Any:
        """A file under <root>/.rocmdoctor/ (fixtures and snapshots only); None when absent or unusable.

        Read like every file of an untrusted tree: no link followed, regular files only, bounded."""
        if name in self._meta_cache:
            return self._meta_cache[name]
        value = None
        if not self.is_live:
            from rocmdoctor import documents  # msgspec: only a replayed tree has meta files

            meta_dir = os.path.join(self.root, META_DIR)
            try:
                if stat_mod.S_ISDIR(os.lstat(meta_dir).st_mode):
                    where = os.path.join(meta_dir, name)
                    raw = read_regular(where, META_READ_LIMIT, follow_links=False)
                    value = documents.load_value(raw, where, META_READ_LIMIT)
            except PermissionError as exc:
                self.denied[f"/{META_DIR}/{name}"] = exc.strerror or "permission denied"
            except (OSError, documents.DocumentError):
                value = None
        self._meta_cache[name] = value
        return value

    def _stat_meta(self) -> dict[str, Any]:
        meta = self.read_json_meta(STAT_FILE)
        return meta if isinstance(meta, dict) else {}

    def exists(self, path: str) -> bool:
        self._note(path)
        if not self.is_live:
            prefix = path.rstrip("/") + "/"
            if any(d == path or d.startswith(prefix) for d in self._stat_meta()):
                return True
        real = self._inside(path, follow_last=False)
        return real is not None and os.path.lexists(real)

    def is_dir(self, path: str) -> bool:
        self._note(path)
        real = self._inside(path)
        return real is not None and os.path.isdir(real)

    def listdir(self, path: str) -> list[str]:
        """Entries of a directory in natural order; [] when it is absent or unreadable."""
        self._note(path)
        real = self._inside(path)
        try:
            names = [] if real is None else os.listdir(real)
        except OSError:
            names = []
        if not self.is_live:
            # Device nodes exist in a captured root only as stat.json entries.
            prefix = path.rstrip("/") + "/"
            for described in self._stat_meta():
                if described.startswith(prefix) and "/" not in described[len(prefix) :]:
                    names.append(described[len(prefix) :])
        return natural_sorted(set(names))

    def listdir_denied(self, path: str) -> bool:
        """True when `path` exists as a directory this user may not list (listdir() then gives [])."""
        self._note(path)
        real = self._inside(path)
        if real is None:
            return False
        try:
            os.listdir(real)
        except PermissionError:
            return True
        except OSError:
            return False
        return False

    def glob(self, pattern: str) -> list[str]:
        """Host paths matching a shell pattern, one path segment per wildcard, natural order."""
        parts = [p for p in pattern.split("/") if p]
        found = ["/"]
        for part in parts:
            nxt: list[str] = []
            for base in found:
                if any(ch in part for ch in "*?["):
                    nxt.extend(
                        os.path.join(base, n) for n in self.listdir(base) if fnmatch.fnmatchcase(n, part)
                    )
                else:
                    candidate = os.path.join(base, part)
                    if self.exists(candidate):
                        nxt.append(candidate)
            found = nxt
        return natural_sorted(found)

    def readlink(self, path: str) -> Read:
        """The link's own text; an absolute target is a host path, resolved under the root by callers."""
        self._note(path)
        real = self._inside(path, follow_last=False)
        if real is None:
            return Read(path, ReadState.UNREADABLE, detail="too many levels of symbolic links")
        try:
            return Read(path, ReadState.OK, os.readlink(real))
        except FileNotFoundError:
            return Read(path, ReadState.MISSING)
        except PermissionError as exc:
            self.denied[os.path.normpath(path)] = exc.strerror or "permission denied"
            return Read(path, ReadState.DENIED, detail=exc.strerror or "")
        except OSError as exc:
            return Read(path, ReadState.UNREADABLE, detail=exc.strerror or str(exc))

    def stat(self, path: str) -> StatInfo | None:
        """Type, mode and owner; from stat.json for a captured root, which cannot carry them."""
        self._note(path)
        if not self.is_live:
            described = self._stat_meta().get(path)
            if isinstance(described, dict):
                try:
                    return StatInfo(
                        path=path,
                        type=str(described.get("type", "file")),
                        mode=int(str(described.get("mode", "0644")), 8),
                        uid=int(described.get("uid", 0)),
                        gid=int(described.get("gid", 0)),
                        rdev=str(described.get("rdev", "")),
                    )
                except (TypeError, ValueError):
                    return None
        real = self._inside(path, follow_last=False)
        try:
            st = os.lstat(real) if real is not None else None
        except OSError:
            st = None
        if st is None:
            return None
        rdev = ""
        if stat_mod.S_ISCHR(st.st_mode) or stat_mod.S_ISBLK(st.st_mode):
            rdev = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        return StatInfo(
            path, _file_type(st.st_mode), stat_mod.S_IMODE(st.st_mode), st.st_uid, st.st_gid, rdev
        )

    def acl(self, path: str) -> Read:
        """The POSIX ACL entries of `path` as getfacl writes them ("user:1000:rw-", "mask::rw-"); from
        stat.json's "acl" list for a captured root. MISSING when the file has no extended ACL."""
        self._note(path)
        if not self.is_live:
            described = self._stat_meta().get(path)
            entries = described.get("acl") if isinstance(described, dict) else None
            if isinstance(entries, list) and all(isinstance(e, str) for e in entries):
                return Read(path, ReadState.OK, [e[:80] for e in entries[:64]])
            return Read(path, ReadState.MISSING)
        try:
            raw = os.getxattr(self._real(path), "system.posix_acl_access", follow_symlinks=False)
        except OSError as exc:
            if exc.errno in (errno.ENODATA, errno.ENOENT, errno.ENOTSUP):
                return Read(path, ReadState.MISSING)
            state = ReadState.DENIED if exc.errno in (errno.EACCES, errno.EPERM) else ReadState.UNREADABLE
            return Read(path, state, detail=exc.strerror or str(exc))
        return Read(path, ReadState.OK, parse_posix_acl(raw))

    def free_bytes(self, path: str) -> int | None:
        """Free space for unprivileged writers at `path` or its nearest existing parent."""
        self._note(path)
        if not path.startswith("/"):
            return None  # a relative path names no place on the host (and dirname() never reaches "/")
        probe = os.path.normpath(path)
        if not self.is_live:
            described = self._stat_meta()
            while True:
                entry = described.get(probe)
                if isinstance(entry, dict) and "free_bytes" in entry:
                    try:
                        return int(entry["free_bytes"])
                    except (TypeError, ValueError):
                        return None
                if probe == "/":
                    return None
                probe = os.path.dirname(probe)
        while not os.path.exists(probe) and probe != "/":
            probe = os.path.dirname(probe)
        try:
            st = os.statvfs(probe)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def fs_size_bytes(self, path: str) -> int | None:
        """The size of the filesystem mounted at `path` (/dev/shm); from stat.json's "size_bytes" for a
        captured root, else unknown there."""
        self._note(path)
        if not self.is_live:
            entry = self._stat_meta().get(os.path.normpath(path))
            size = entry.get("size_bytes") if isinstance(entry, dict) else None
            return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None
        try:
            st = os.statvfs(path)
        except OSError:
            return None
        return st.f_frsize * st.f_blocks

    def file_digest(self, path: str, whole_limit: int, edge_bytes: int) -> Read:
        """sha256 of a regular file, opened without following its last link: "sha256:<hex>" of the whole
        file up to `whole_limit` bytes; above it "edges-sha256:<size>:<hex>" of the size and the first and
        last `edge_bytes` (enough to tell two large weight files apart without reading them whole)."""
        fd = self._open(path, follow_last=False)
        if isinstance(fd, Read):
            return fd
        import hashlib  # only for a digest: not on the check path

        digest = hashlib.sha256()
        try:
            opened = os.fstat(fd)
            size = opened.st_size
            if not stat_mod.S_ISREG(opened.st_mode):
                return Read(path, ReadState.UNREADABLE, detail="not a regular file")
            if size <= whole_limit:
                while chunk := os.read(fd, 1 << 20):
                    digest.update(chunk)
                return Read(path, ReadState.OK, f"sha256:{digest.hexdigest()}")
            digest.update(os.pread(fd, edge_bytes, 0))
            digest.update(os.pread(fd, edge_bytes, size - edge_bytes))
            return Read(path, ReadState.OK, f"edges-sha256:{size}:{digest.hexdigest()}")
        except OSError as exc:
            return Read(path, ReadState.UNREADABLE, detail=exc.strerror or str(exc))
        finally:
            os.close(fd)

    def distro(self) -> dict[str, str]:
        """id, version, name, like and codename from os-release (through `distro`, under the root).

        `distro` chokes on some files (invalid UTF-8, unbalanced quotes); those are parsed leniently.
        """
        import distro as distro_mod

        self._note("/etc/os-release")
        release = self._inside("/etc/os-release")
        try:
            st = os.stat(release) if release is not None else None
        except OSError:
            st = None
        linked = not self.is_live and release != self._real("/etc/os-release")
        if st is not None and (linked or not stat_mod.S_ISREG(st.st_mode) or st.st_size > OS_RELEASE_LIMIT):
            # `distro` opens the file itself: only a plain, small file that is no link goes to it.
            return self._os_release_lenient()
        try:
            info = distro_mod.LinuxDistribution(
                include_lsb=False,
                include_uname=False,
                include_oslevel=False,
                root_dir=None if self.is_live else str(self.root),
            )
            return {
                "id": info.id(),
                "version": info.version(best=True),
                "name": info.name(pretty=False),
                "like": info.like(),
                "codename": info.codename(),
            }
        except (UnicodeDecodeError, ValueError, OSError):
            return self._os_release_lenient()

    def _os_release_lenient(self) -> dict[str, str]:
        fields: dict[str, str] = {}
        for path in ("/etc/os-release", "/usr/lib/os-release"):
            raw = self.read_text(path, limit=OS_RELEASE_LIMIT)
            if raw.ok:
                for line in raw.value.splitlines():
                    key, sep, value = line.partition("=")
                    if sep and key.strip().isidentifier():
                        fields[key.strip()] = value.strip().strip("\"'")
                break
        return {
            "id": fields.get("ID", "").lower(),
            "version": fields.get("VERSION_ID", ""),
            "name": fields.get("NAME", ""),
            "like": fields.get("ID_LIKE", ""),
            "codename": fields.get("VERSION_CODENAME", ""),
        }

    # -- identity and environment ------------------------------------------------------

    @property
    def env(self) -> Mapping[str, str]:
        if self.is_live:
            return os.environ
        meta = self.read_json_meta(ENV_FILE)
        return {str(k): str(v) for k, v in meta.items()} if isinstance(meta, dict) else {}

    def identity(self) -> Identity | None:
        if self.is_live:
            import pwd

            uid = os.getuid()
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            return Identity(name, uid, os.getgid(), tuple(sorted(set(os.getgroups()) | {os.getgid()})))
        meta = self.read_json_meta(IDENTITY_FILE)
        if not isinstance(meta, dict):
            return None
        try:
            return Identity(
                str(meta["user"]),
                int(meta["uid"]),
                int(meta["gid"]),
                tuple(int(g) for g in meta.get("process_gids", [])),
            )
        except (KeyError, TypeError, ValueError):
            return None

    # -- processes -----------------------------------------------------------------------

    def pids(self) -> list[int]:
        return [int(n) for n in self.listdir("/proc") if is_decimal(n)]

    # -- commands (the deep probe, daemon-reload); never raises --------------------------

    def run(
        self,
        argv: list[str],
        timeout: float = 10.0,
        env: Mapping[str, str] | None = None,
        max_output: int = 256 * 1024,
        program_is_users_choice: bool = False,
    ) -> RunResult:
        """Run a command in its own process group; on timeout the whole group is killed.

        On a captured root nothing runs (the programs there, or the live host's, would answer for
        another machine) unless the user named the program (`--python`): then it is their call."""
        if not self.is_live and not program_is_users_choice:
            return RunResult(
                tuple(argv),
                None,
                spawn_error=f"not run: --root {self.root} is a captured tree, and nothing is executed for one",
            )
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
        except OSError as exc:
            return RunResult(tuple(argv), None, spawn_error=exc.strerror or str(exc))
        try:
            out, err = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = proc.communicate()
            timed_out = True
        return RunResult(
            tuple(argv),
            None if timed_out else proc.returncode,
            out.decode("utf-8", "replace")[-max_output:],
            err.decode("utf-8", "replace")[-max_output:],
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )
