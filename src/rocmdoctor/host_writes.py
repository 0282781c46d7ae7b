"""The write and run seam: every change provisioning makes to a host goes through `HostWriter`.

It is bound to a root like `Host`. On the live root (`/`) links are the administrator's own
(/opt -> /data/opt): files are written with the ordinary atomic writer, and accounts are created with
useradd/groupadd, which also run the host's hooks. On any other root (a captured host, an image being
built, a fixture: a tree that may come from anyone) every path is opened one component at a time from
a descriptor of the root with O_NOFOLLOW (a link anywhere on the way is refused, never followed),
files are replaced atomically through that descriptor, accounts are added by editing the tree's
/etc/{passwd,group,shadow,gshadow} by rocmdoctor's own code, and nothing is executed (`useradd --root`
would chroot into the tree and run its binaries and PAM modules as root).
"""

from __future__ import annotations

import errno
import io
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rocmdoctor import host_files
from rocmdoctor.atomic import atomic_file, fsync_dir, owner_gone, write_atomic
from rocmdoctor.litter import owner_pid, temp_name
from rocmdoctor.textnum import is_decimal

MAX_FILE_BYTES = 4 << 20
SYSTEM_ID_RANGE = (100, 999)  # Debian's SYS_UID_MIN/SYS_UID_MAX defaults (login.defs may change them)


class WriteRefused(ValueError):
    """A path inside the root cannot be used safely, or a change cannot be made there; says why."""


def is_live(root: Path) -> bool:
    """The running machine's own root (the same directory as `/`, whatever the path says)."""
    try:
        here, slash = os.stat(root), os.stat("/")
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (slash.st_dev, slash.st_ino)


def _parts(host_path: str) -> list[str]:
    parts = [p for p in host_path.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise WriteRefused(f"{host_path!r} is not a normalised absolute path")
    return parts


@contextmanager
def _dir_fd(root: Path, parts: list[str], create: bool) -> Iterator[int]:
    """A descriptor of root/parts..., each component opened with O_NOFOLLOW (created 0755 if asked)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    where = "/" + "/".join(parts[: i + 1])
                    raise WriteRefused(
                        f"{root}{where} is a link or not a directory; refusing to follow it out of --root"
                    ) from None
                raise
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


def read_file(root: Path, host_path: str, limit: int = MAX_FILE_BYTES) -> bytes | None:
    """The bytes of root/host_path, None when it does not exist. Regular files only, bounded, and on a
    foreign root never through a link."""
    parts = _parts(host_path)
    live = is_live(root)
    try:
        if live:
            fd = os.open(host_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        else:
            with _dir_fd(root, parts[:-1], create=False) as dfd:
                flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(parts[-1], flags, dir_fd=dfd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            where = root / host_path.lstrip("/")
            raise WriteRefused(f"{where} is a link; refusing to follow it out of --root") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise WriteRefused(f"{root / host_path.lstrip('/')} is not a regular file")
        data = b""
        while len(data) <= limit:
            chunk = os.read(fd, limit + 1 - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    if len(data) > limit:
        raise WriteRefused(f"{root / host_path.lstrip('/')} is larger than {limit} bytes")
    return data


def write_file(root: Path, host_path: str, data: bytes, mode: int) -> None:
    """Replace root/host_path atomically (temp file, fsync, rename, fsync the directory)."""
    if is_live(root):
        write_atomic(Path(host_path), data, mode)
        return
    parts = _parts(host_path)
    with _dir_fd(root, parts[:-1], create=True) as dfd:
        tmp = temp_name(parts[-1])
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, mode, dir_fd=dfd)
        try:
            try:
                os.fchmod(fd, mode)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        os.fsync(dfd)
        _sweep_at(dfd, f".{parts[-1]}.tmp-")


def _sweep_at(dfd: int, prefix: str) -> None:
    """litter.sweep inside a tree, by directory fd: killed runs' temp files of this name, no link followed."""
    for entry in os.listdir(dfd):
        pid = owner_pid(entry) if entry.startswith(prefix) else None
        if pid is not None and owner_gone(pid):
            try:
                os.unlink(entry, dir_fd=dfd)
            except OSError:
                pass


def chmod_file(root: Path, host_path: str, mode: int) -> None:
    if is_live(root):
        os.chmod(host_path, mode)
        return
    parts = _parts(host_path)
    with _dir_fd(root, parts[:-1], create=False) as dfd:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


def list_dir(root: Path, host_dir: str) -> list[str]:
    """The names in root/host_dir, sorted (empty when it does not exist); on a foreign root no link
    on the way is followed."""
    try:
        if is_live(root):
            return sorted(os.listdir(host_dir))
        with _dir_fd(root, _parts(host_dir), create=False) as dfd:
            return sorted(os.listdir(dfd))
    except (FileNotFoundError, NotADirectoryError):
        return []


def remove_file(root: Path, host_path: str) -> bool:
    """Remove root/host_path (a link itself, never what it points at); False when it was absent."""
    parts = _parts(host_path)
    try:
        if is_live(root):
            os.unlink(host_path)
            fsync_dir(Path(host_path).parent)
            return True
        with _dir_fd(root, parts[:-1], create=False) as dfd:
            os.unlink(parts[-1], dir_fd=dfd)
            os.fsync(dfd)
        return True
    except FileNotFoundError:
        return False


# -- accounts ------------------------------------------------------------------------------------------


def _lines(root: Path, db: str) -> list[str]:
    data = read_file(root, f"/etc/{db}")
    if data is None:
        return []
    try:
        return data.decode().splitlines()
    except UnicodeDecodeError:
        raise WriteRefused(f"{root}/etc/{db} is not UTF-8 text") from None


def names(root: Path, db: str) -> set[str]:
    return {line.split(":", 1)[0] for line in _lines(root, db) if line and not line.startswith("#")}


def _ids(lines: list[str]) -> set[int]:
    used = set()
    for line in lines:
        fields = line.split(":")
        if len(fields) > 2 and is_decimal(fields[2]):
            used.add(int(fields[2]))
    return used


# Ids a system account never takes, whatever a tree's login.defs says: root, the overflow and "nobody"
# ids (65534; 65535 and 2^32-1 are (uid_t)-1 for 16 and 32 bits) and anything past 2^31-1 (a negative
# pid_t/uid_t for much of userland).
FORBIDDEN_IDS = frozenset({0, 65534, 65535, 4294967294, 4294967295})
MAX_ID = 2**31 - 1


def _system_range(root: Path, kind: str) -> tuple[int, int]:
    """SYS_<kind>_MIN..MAX of the tree's login.defs, clamped to 1..2^31-1."""
    low, high = SYSTEM_ID_RANGE
    for line in _lines(root, "login.defs"):
        words = line.split()
        if len(words) == 2 and is_decimal(words[1]):
            if words[0] == f"SYS_{kind}_MIN":
                low = int(words[1])
            elif words[0] == f"SYS_{kind}_MAX":
                high = int(words[1])
    return max(low, 1), min(high, MAX_ID)


def sane_id(candidate: int) -> bool:
    return 0 < candidate <= MAX_ID and candidate not in FORBIDDEN_IDS


def _free_id(root: Path, kind: str, used: set[int], prefer: int | None = None) -> int:
    """Like useradd --system: the highest free id in the system range (or `prefer` when it is free);
    never a forbidden id (FORBIDDEN_IDS, above MAX_ID)."""
    low, high = _system_range(root, kind)
    if prefer is not None and low <= prefer <= high and prefer not in used and sane_id(prefer):
        return prefer
    for candidate in range(high, max(low, high - 100_000) - 1, -1):
        if candidate not in used and sane_id(candidate):
            return candidate
    raise WriteRefused(
        f"no free system {kind.lower()} id in {low}..{high} (SYS_{kind}_MIN/MAX of {root}/etc/login.defs, "
        f"kept within 1..{MAX_ID}, never 65534 or the overflow ids); fix login.defs or free an id"
    )


def _append(root: Path, db: str, line: str, mode: int) -> None:
    existing = read_file(root, f"/etc/{db}")
    if existing is None and db in ("shadow", "gshadow"):
        return  # a tree without shadow files keeps none
    text = (existing or b"").decode()
    if text and not text.endswith("\n"):
        text += "\n"
    write_file(root, f"/etc/{db}", (text + line + "\n").encode(), mode_of(root, f"/etc/{db}", mode))


def mode_of(root: Path, host_path: str, default: int) -> int:
    """The permission bits of root/host_path (`default` when it cannot be stat'ed)."""
    if is_live(root):
        try:
            return stat.S_IMODE(os.stat(host_path).st_mode)
        except OSError:
            return default
    try:
        parts = _parts(host_path)
        with _dir_fd(root, parts[:-1], create=False) as dfd:
            return stat.S_IMODE(os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        return default


def add_group(root: Path, group: str, gid: int | None = None) -> int:
    """A system group in root/etc/group (and gshadow when the tree has one); returns its gid. Converges:
    a group whose gshadow line a killed run did not write gets it now."""
    if is_live(root):
        run(["groupadd", "--system", group])
        return -1
    if group not in names(root, "group"):
        gid = _free_id(root, "GID", _ids(_lines(root, "group")), gid)
        _append(root, "group", f"{group}:x:{gid}:", 0o644)
    if group not in names(root, "gshadow"):
        _append(root, "gshadow", f"{group}:!::", 0o640)
    return _gid_of(root, group)


def account_complete(root: Path, user: str) -> bool:
    """The user's line is in passwd, its group in group, and in shadow/gshadow where the tree has them."""
    if is_live(root):
        return user in names(root, "passwd")
    if user not in names(root, "passwd") or user not in names(root, "group"):
        return False
    return all(
        read_file(root, f"/etc/{db}") is None or user in names(root, db) for db in ("shadow", "gshadow")
    )


def add_system_user(root: Path, user: str, home: str, shell: str, comment: str) -> None:
    """A system user with its own group, no login, no home created (useradd --system --user-group).
    On a tree each file is written only where the account's line is missing, so a rerun after a kill
    between the group, gshadow, passwd and shadow writes completes the account."""
    if is_live(root):
        run(
            [
                "useradd",
                "--system",
                "--user-group",
                "--home-dir",
                home,
                "--no-create-home",
                "--shell",
                shell,
                "--comment",
                comment,
                user,
            ]
        )
        return
    for field in (user, home, shell, comment):
        if ":" in field or "\n" in field:
            raise WriteRefused(f"{field!r} cannot go into /etc/passwd (':' or a newline)")
    uid = uid_of(root, user)
    if uid is None:
        uid = _free_id(root, "UID", _ids(_lines(root, "passwd")))
    gid = add_group(root, user, gid=uid)
    if user not in names(root, "passwd"):
        _append(root, "passwd", f"{user}:x:{uid}:{gid}:{comment}:{home}:{shell}", 0o644)
    if user not in names(root, "shadow"):
        _append(root, "shadow", f"{user}:!:{int(time.time() // 86400)}::::::", 0o640)


def _gid_of(root: Path, group: str) -> int:
    for line in _lines(root, "group"):
        fields = line.split(":")
        if fields[0] == group and len(fields) > 2 and is_decimal(fields[2]):
            return int(fields[2])
    raise WriteRefused(f"group {group} has no gid in {root}/etc/group")


def uid_of(root: Path, user: str) -> int | None:
    for line in _lines(root, "passwd"):
        fields = line.split(":")
        if fields[0] == user and len(fields) > 2 and is_decimal(fields[2]):
            return int(fields[2])
    return None


def run(argv: list[str], timeout_s: float = 60.0) -> None:
    """A program of the live host (never of a foreign root)."""
    try:
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise WriteRefused(
            f"{argv[0]} is not installed (package passwd); create the account yourself"
        ) from None
    except subprocess.TimeoutExpired:
        raise WriteRefused(f"{' '.join(argv)} did not finish within {timeout_s:g} s") from None
    if done.returncode != 0:
        raise WriteRefused(f"{' '.join(argv)} failed: {done.stderr.strip()}")


def symlink(root: Path, host_path: str, target: str) -> None:
    """Point root/host_path at `target`, atomically (a temp link renamed over the old one)."""
    if is_live(root):
        live_tmp = Path(host_path).with_name(temp_name(Path(host_path).name))
        os.symlink(target, live_tmp)
        os.replace(live_tmp, host_path)
        return
    parts = _parts(host_path)
    with _dir_fd(root, parts[:-1], create=True) as dfd:
        tmp = temp_name(parts[-1])
        os.symlink(target, tmp, dir_fd=dfd)
        os.rename(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)


@dataclass(frozen=True)
class Operation:
    """One change a writer made or, in check mode, would have made."""

    action: str  # write, chmod, remove, symlink, group, user, run; install, activate (a bundle prefix)
    subject: str  # the host path, the account, or the program


class HostWriter:
    """The one seam that changes a tree (or, at `/`, this host): the functions above, bound to one root.

    Every change is recorded in `operations`; in check mode none is made, so a dry run cannot write
    whatever the code above it does (reads still read, so the diff is against what is there)."""

    def __init__(self, root: Path | str = "/", check_mode: bool = False) -> None:
        self.root = Path(root)
        self.check_mode = check_mode
        self.operations: list[Operation] = []

    def change(self, action: str, subject: str) -> bool:
        """Record one change; True when it is to be made. The seam's own methods call it; so does
        provisioning for a change made of several steps of its own trees (a bundle swapped into place,
        a prefix's `current` moved), so check mode stops those too."""
        self.operations.append(Operation(action, subject))
        return not self.check_mode

    @property
    def is_live(self) -> bool:
        return is_live(self.root)

    def read_current(self, host_path: str, limit: int = MAX_FILE_BYTES) -> bytes | None:
        return read_file(self.root, host_path, limit)

    def current_mode(self, host_path: str) -> int | None:
        """The permission bits of the file there; None when nothing can be stat'ed."""
        mode = mode_of(self.root, host_path, -1)
        return None if mode == -1 else mode

    def write_file(self, host_path: str, content: bytes, mode: int = 0o644) -> None:
        if self.change("write", host_path):
            write_file(self.root, host_path, content, mode)

    def chmod(self, host_path: str, mode: int) -> None:
        if self.change("chmod", host_path):
            chmod_file(self.root, host_path, mode)

    def listdir(self, host_dir: str) -> list[str]:
        return list_dir(self.root, host_dir)

    def remove_file(self, host_path: str) -> bool:
        if self.change("remove", host_path):
            return remove_file(self.root, host_path)
        return self.current_mode(host_path) is not None

    def symlink(self, host_path: str, target: str) -> None:
        if self.change("symlink", host_path):
            symlink(self.root, host_path, target)

    def group_names(self) -> set[str]:
        return names(self.root, "group")

    def uid_of(self, user: str) -> int | None:
        return uid_of(self.root, user)

    def add_group(self, group: str) -> None:
        if self.change("group", group):
            add_group(self.root, group)

    def add_system_user(self, user: str, home: str, shell: str, comment: str) -> None:
        if self.change("user", user):
            add_system_user(self.root, user, home, shell, comment)

    def account_complete(self, user: str) -> bool:
        return account_complete(self.root, user)

    def run(self, argv: list[str], timeout_s: float = 60.0) -> None:
        """A program of the live host; refused for any other root (nothing is executed for a tree).
        `timeout_s`: longer for a unit's restart, which returns once the server is ready."""
        if not self.is_live:
            raise WriteRefused(
                f"not running {argv[0]} for --root {self.root}: nothing is executed for a tree"
            )
        if self.change("run", " ".join(argv)):
            run(argv, timeout_s)

    def add_to_groups(self, user: str, groups: list[str]) -> None:
        if groups and self.change("groups", f"{user}: {','.join(groups)}"):
            add_to_groups(self.root, user, groups)

    @property
    def trees(self) -> OwnedTrees:
        """The prefix, download and mirror trees this command may change, through this writer."""
        return OwnedTrees(self)

    def past(self, done: str, would: str | None = None) -> str:
        """The one wording of a change: `done` ("removed"), or "would <would>" in check mode."""
        return f"would {would or done}" if self.check_mode else done

    def write_text_file(self, path: Path, content: str, mode: int = 0o644) -> None:
        """A file this machine's user named (a textfile, a record beside a tree), atomically: the live
        filesystem's path, links as the administrator made them (not a --target tree)."""
        if self.change("write", str(path)):
            write_atomic(path, content, mode)


# -- group membership (rocmdoctor fix) ------------------------------------------------------------


def with_members(text: str, user: str, groups: list[str], members_field: int) -> str:
    """`text` (group or gshadow) with `user` added to the member list of each of `groups`."""
    out = []
    for line in text.splitlines():
        fields = line.split(":")
        if fields[0] in groups and len(fields) > members_field:
            members = [m for m in fields[members_field].split(",") if m]
            if user not in members:
                fields[members_field] = ",".join([*members, user])
            line = ":".join(fields)
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") or not text else "")


def add_to_groups(root: Path, user: str, groups: list[str]) -> None:
    """Make `user` a member of `groups` (usermod -aG on this machine; /etc/group and gshadow in a tree)."""
    if not groups:
        return
    if is_live(root):
        run(["usermod", "-aG", ",".join(groups), user])
        return
    if ":" in user or "," in user or "\n" in user:
        raise WriteRefused(f"{user!r} cannot go into /etc/group")
    for db, field_index, mode in (("group", 3, 0o644), ("gshadow", 3, 0o640)):
        existing = read_file(root, f"/etc/{db}")
        if existing is None:
            continue
        # bytes that are not UTF-8 (a name, a comment) are kept exactly, never a reason to fail
        new = with_members(existing.decode(errors="surrogateescape"), user, groups, field_index)
        write_file(
            root, f"/etc/{db}", new.encode(errors="surrogateescape"), mode_of(root, f"/etc/{db}", mode)
        )


# -- the trees rocmdoctor owns (a bundle prefix, a download directory, a mirror) ------------------------


class OwnedTrees:
    """A bundle prefix's trees through the writer that owns the command's effects: the tree-sized
    operations of `host_files` (absolute paths the user named with --prefix, --download-dir or a mirror),
    each recorded on the writer and, in its check mode, not made. Reads pass through. Built without a
    writer (a `Layout` that only lists bundles) it refuses every effect."""

    def __init__(self, writer: HostWriter | None) -> None:
        self.writer = writer

    def _effect(self, action: str, subject: Path | str) -> bool:
        if self.writer is None:
            raise WriteRefused(f"not changing {subject}: this command only reads")
        return self.writer.change(action, str(subject))

    # reads
    readlink = staticmethod(host_files.readlink)
    exists = staticmethod(host_files.exists)
    lexists = staticmethod(host_files.lexists)
    is_dir = staticmethod(host_files.is_dir)
    is_file = staticmethod(host_files.is_file)
    is_link = staticmethod(host_files.is_link)
    list_dir = staticmethod(host_files.list_dir)
    glob = staticmethod(host_files.glob)
    tree_bytes = staticmethod(host_files.tree_bytes)
    same_file = staticmethod(host_files.same_file)
    real_path = staticmethod(host_files.real_path)
    open_plain = staticmethod(host_files.open_plain)

    # effects
    def make_dirs(self, path: Path, exist_ok: bool = True) -> None:
        if self._effect("mkdir", path):
            host_files.make_dirs(path, exist_ok)

    def remove(self, path: Path, missing_ok: bool = True) -> None:
        if self._effect("remove", path):
            host_files.remove(path, missing_ok)

    def replace(self, source: Path, target: Path) -> None:
        if self._effect("rename", f"{source} -> {target}"):
            host_files.replace(source, target)

    def remove_tree(self, path: Path, ignore_errors: bool = False) -> None:
        if self._effect("remove-tree", path):
            host_files.remove_tree(path, ignore_errors)

    def sync_dir(self, path: Path) -> None:
        if self._effect("sync", path):
            host_files.sync_dir(path)

    def add_exec_bits(self, path: Path) -> None:
        if self._effect("chmod", path):
            host_files.add_exec_bits(path)

    def swap_symlink(self, link: Path, target: str) -> None:
        if self._effect("symlink", f"{link} -> {target}"):
            host_files.swap_symlink(link, target)

    def exchange(self, a: Path, b: Path) -> bool:
        """True when the two trees were swapped (or, in check mode, would be tried)."""
        if self._effect("exchange", f"{a} <-> {b}"):
            return host_files.exchange(a, b)
        return True

    def try_lock(self, path: Path) -> int:
        self._effect("lock", path)  # a lock is taken in check mode too: it changes no content
        return host_files.try_lock(path)

    unlock = staticmethod(host_files.unlock)

    def secure_dir(self, path: Path) -> Path:
        if self._effect("mkdir", path):
            return host_files.secure_dir(path)
        return path

    def write_json(self, path: Path, doc: object) -> None:
        """`doc` as indented JSON, atomically."""
        import json

        if self._effect("write", path):
            write_atomic(path, json.dumps(doc, indent=2) + "\n")

    def write_atomic(self, path: Path, content: str | bytes, mode: int = 0o644) -> None:
        if self._effect("write", path):
            write_atomic(path, content, mode)

    @contextmanager
    def atomic_file(self, path: Path, mode: int = 0o644) -> Iterator[BinaryIO]:
        """A file streamed into place atomically (a snapshot archive); in check mode written nowhere."""
        if not self._effect("write", path):
            yield io.BytesIO()
            return
        with atomic_file(path, mode) as out:
            yield out

    def open_new(self, path: Path) -> io.FileIO:
        """A new file of ours in a download or mirror directory (host_files.open_owned CREATE)."""
        self._effect("write", path)
        return host_files.open_owned(path, host_files.CREATE)
