"""The write and run seam: every change provisioning makes to a host goes through `HostWriter`.

It is bound to the same root as `Host`. On the live root (`/`) it writes files atomically and runs
the system's own tools (`groupadd`, `useradd`, `systemctl`). On any other root (a fixture, an image
being prepared, a replayed snapshot) it writes inside that root by rocmdoctor's own code: links in
the tree are resolved inside it (never followed out), accounts are added by editing the tree's
`/etc/passwd` and `/etc/group`, and nothing is executed (no `useradd --root`, which chroots and runs
the tree's own binaries).
"""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .atomic import atomic_file
from .rootfs import read_regular, resolve_inside

# Account databases are small; a larger one is not an account database.
ACCOUNT_DB_LIMIT = 8 << 20
# Where system accounts start and end (login.defs SYS_UID_MIN/SYS_UID_MAX defaults on Debian and Fedora).
SYSTEM_ID_RANGE = range(100, 1000)
NOLOGIN = "/usr/sbin/nologin"


class WriteRefused(RuntimeError):
    """The change cannot be made safely on this root; the message says what to do instead."""


@dataclass(frozen=True)
class HostWriter:
    root: Path = Path("/")

    @property
    def is_live(self) -> bool:
        return self.root == Path("/")

    def real_path(self, host_path: str) -> Path:
        """The file a host path names under the root: its directories resolved inside the root, the
        last component never followed (a link there is replaced, not written through)."""
        if not host_path.startswith("/"):
            raise WriteRefused(f"host paths are absolute: {host_path!r}")
        if self.is_live:
            return Path(os.path.normpath(host_path))
        parent = resolve_inside(str(self.root), os.path.dirname(os.path.normpath(host_path)))
        if parent is None:
            raise WriteRefused(f"{host_path}: too many levels of symbolic links under {self.root}")
        return Path(parent) / os.path.basename(host_path)

    def read_current(self, host_path: str, limit: int = 1 << 20) -> bytes | None:
        """What is there now (for the diff); None when absent. A link or special file is no content."""
        try:
            return read_regular(self.real_path(host_path), limit, follow_links=self.is_live)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise WriteRefused(f"cannot read the current {host_path}: {exc}") from None

    def current_mode(self, host_path: str) -> int | None:
        try:
            st = os.lstat(self.real_path(host_path))
        except FileNotFoundError:
            return None
        return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None

    def write_file(self, host_path: str, content: bytes, mode: int = 0o644) -> None:
        real = self.real_path(host_path)
        self._make_dirs(real.parent)
        with atomic_file(real, mode) as out:
            out.write(content)

    def symlink(self, host_path: str, target: str) -> None:
        """Point host_path at target, atomically (a temp link renamed over the old one)."""
        real = self.real_path(host_path)
        self._make_dirs(real.parent)
        tmp = real.parent / f".{real.name}.tmp-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        os.symlink(target, tmp)
        os.replace(tmp, real)

    def _make_dirs(self, real_dir: Path) -> None:
        if not self.is_live:
            root = str(self.root)
            if real_dir != self.root and not str(real_dir).startswith(root + os.sep):
                raise WriteRefused(f"{real_dir} is outside {self.root}")
        real_dir.mkdir(parents=True, exist_ok=True)

    # -- accounts --------------------------------------------------------------------------

    def _db(self, name: str) -> list[list[str]]:
        raw = self.read_current(f"/etc/{name}", ACCOUNT_DB_LIMIT)
        text = (raw or b"").decode("utf-8", "replace")
        return [line.split(":") for line in text.splitlines() if line and not line.startswith("#")]

    def group_names(self) -> set[str]:
        return {fields[0] for fields in self._db("group")}

    def user_names(self) -> set[str]:
        return {fields[0] for fields in self._db("passwd")}

    def _free_id(self, taken: set[int]) -> int:
        for candidate in reversed(SYSTEM_ID_RANGE):  # system ids are handed out from the top, as useradd does
            if candidate not in taken:
                return candidate
        raise WriteRefused(f"no free system id in {self.root}/etc (all of 100-999 taken)")

    def _append(self, db: str, line: str) -> None:
        current = self.read_current(f"/etc/{db}", ACCOUNT_DB_LIMIT) or b""
        if current and not current.endswith(b"\n"):
            current += b"\n"
        mode = self.current_mode(f"/etc/{db}") or 0o644
        self.write_file(f"/etc/{db}", current + line.encode() + b"\n", mode)

    def ensure_group(self, group: str) -> bool:
        """Add a system group when missing; True when it was added."""
        if group in self.group_names():
            return False
        if self.is_live:
            self.run(["groupadd", "--system", group])
            return True
        gid = self._free_id({int(f[2]) for f in self._db("group") if len(f) > 2 and f[2].isdigit()})
        self._append("group", f"{group}:x:{gid}:")
        return True

    def ensure_user(self, user: str, home: str, groups: tuple[str, ...]) -> bool:
        """Add a system user with its own group and the supplementary `groups` when missing."""
        if user in self.user_names():
            return False
        if self.is_live:
            self.run(["useradd", "--system", "--user-group", "--home-dir", home, "--no-create-home",
                      "--shell", NOLOGIN, *(["--groups", ",".join(groups)] if groups else []), user])
            return True
        self.ensure_group(user)
        gid = next(int(f[2]) for f in self._db("group") if f[0] == user)
        uid = self._free_id({int(f[2]) for f in self._db("passwd") if len(f) > 2 and f[2].isdigit()})
        self._append("passwd", f"{user}:x:{uid}:{gid}:{user}:{home}:{NOLOGIN}")
        for group in groups:
            self._add_member(group, user)
        return True

    def _add_member(self, group: str, user: str) -> None:
        lines = []
        for fields in self._db("group"):
            if fields[0] == group and len(fields) >= 4:
                members = [m for m in fields[3].split(",") if m]
                if user not in members:
                    fields[3] = ",".join([*members, user])
            lines.append(":".join(fields))
        mode = self.current_mode("/etc/group") or 0o644
        self.write_file("/etc/group", ("\n".join(lines) + "\n").encode(), mode)

    # -- processes -------------------------------------------------------------------------

    def run(self, argv: list[str], timeout: float = 60.0) -> str:
        """Run one of the system's tools on the live host; refused for any other root."""
        if not self.is_live:
            raise WriteRefused(f"not running {argv[0]} for --root {self.root}: nothing is executed for a tree")
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WriteRefused(f"{' '.join(argv)} could not run: {exc}") from None
        if done.returncode != 0:
            raise WriteRefused(f"{' '.join(argv)} failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
        return done.stdout
