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
import os
import secrets
import stat
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .atomic import fsync_dir, write_atomic

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
        tmp = f".{parts[-1]}.tmp-{secrets.token_hex(6)}"
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
        if len(fields) > 2 and fields[2].isdigit():
            used.add(int(fields[2]))
    return used


def _system_range(root: Path, kind: str) -> tuple[int, int]:
    low, high = SYSTEM_ID_RANGE
    for line in _lines(root, "login.defs"):
        words = line.split()
        if len(words) == 2 and words[1].isdigit():
            if words[0] == f"SYS_{kind}_MIN":
                low = int(words[1])
            elif words[0] == f"SYS_{kind}_MAX":
                high = int(words[1])
    return low, high


def _free_id(root: Path, kind: str, used: set[int], prefer: int | None = None) -> int:
    """Like useradd --system: the highest free id in the system range (or `prefer` when it is free)."""
    low, high = _system_range(root, kind)
    if prefer is not None and low <= prefer <= high and prefer not in used:
        return prefer
    for candidate in range(high, low - 1, -1):
        if candidate not in used:
            return candidate
    raise WriteRefused(f"no free system {kind.lower()} id between {low} and {high} in {root}/etc")


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
    """A system group in root/etc/group (and gshadow when the tree has one); returns its gid."""
    if is_live(root):
        run(["groupadd", "--system", group])
        return -1
    gid = _free_id(root, "GID", _ids(_lines(root, "group")), gid)
    _append(root, "group", f"{group}:x:{gid}:", 0o644)
    _append(root, "gshadow", f"{group}:!::", 0o640)
    return gid


def add_system_user(root: Path, user: str, home: str, shell: str, comment: str) -> None:
    """A system user with its own group, no login, no home created (useradd --system --user-group)."""
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
    uid = _free_id(root, "UID", _ids(_lines(root, "passwd")))
    gid = add_group(root, user, gid=uid) if user not in names(root, "group") else _gid_of(root, user)
    _append(root, "passwd", f"{user}:x:{uid}:{gid}:{comment}:{home}:{shell}", 0o644)
    _append(root, "shadow", f"{user}:!:{int(time.time() // 86400)}::::::", 0o640)


def _gid_of(root: Path, group: str) -> int:
    for line in _lines(root, "group"):
        fields = line.split(":")
        if fields[0] == group and len(fields) > 2 and fields[2].isdigit():
            return int(fields[2])
    raise WriteRefused(f"group {group} has no gid in {root}/etc/group")


def uid_of(root: Path, user: str) -> int | None:
    for line in _lines(root, "passwd"):
        fields = line.split(":")
        if fields[0] == user and len(fields) > 2 and fields[2].isdigit():
            return int(fields[2])
    return None


def run(argv: list[str]) -> None:
    """A program of the live host (never of a foreign root)."""
    try:
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise WriteRefused(
            f"{argv[0]} is not installed (package passwd); create the account yourself"
        ) from None
    except subprocess.TimeoutExpired:
        raise WriteRefused(f"{' '.join(argv)} did not finish within 60 s") from None
    if done.returncode != 0:
        raise WriteRefused(f"{' '.join(argv)} failed: {done.stderr.strip()}")


def symlink(root: Path, host_path: str, target: str) -> None:
    """Point root/host_path at `target`, atomically (a temp link renamed over the old one)."""
    if is_live(root):
        live_tmp = Path(f"{host_path}.tmp-{secrets.token_hex(6)}")
        os.symlink(target, live_tmp)
        os.replace(live_tmp, host_path)
        return
    parts = _parts(host_path)
    with _dir_fd(root, parts[:-1], create=True) as dfd:
        tmp = f".{parts[-1]}.tmp-{secrets.token_hex(6)}"
        os.symlink(target, tmp, dir_fd=dfd)
        os.rename(tmp, parts[-1], src_dir_fd=dfd, dst_dir_fd=dfd)


class HostWriter:
    """The functions above, bound to one root."""

    def __init__(self, root: Path | str = "/") -> None:
        self.root = Path(root)

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
        write_file(self.root, host_path, content, mode)

    def chmod(self, host_path: str, mode: int) -> None:
        chmod_file(self.root, host_path, mode)

    def listdir(self, host_dir: str) -> list[str]:
        return list_dir(self.root, host_dir)

    def remove_file(self, host_path: str) -> bool:
        return remove_file(self.root, host_path)

    def symlink(self, host_path: str, target: str) -> None:
        symlink(self.root, host_path, target)

    def group_names(self) -> set[str]:
        return names(self.root, "group")

    def uid_of(self, user: str) -> int | None:
        return uid_of(self.root, user)

    def add_group(self, group: str) -> None:
        add_group(self.root, group)

    def add_system_user(self, user: str, home: str, shell: str, comment: str) -> None:
        add_system_user(self.root, user, home, shell, comment)

    def run(self, argv: list[str]) -> None:
        """A program of the live host; refused for any other root (nothing is executed for a tree)."""
        if not self.is_live:
            raise WriteRefused(
                f"not running {argv[0]} for --root {self.root}: nothing is executed for a tree"
            )
        run(argv)


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
        new = with_members(existing.decode(), user, groups, field_index)
        write_file(root, f"/etc/{db}", new.encode(), mode_of(root, f"/etc/{db}", mode))
