"""Trees the tests write into and compare: a root with this machine's account databases, and the exact
state of a tree (content, link targets, modes; nothing followed) to prove a run wrote nothing."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

ACCOUNT_FILES = ("passwd", "group", "shadow", "gshadow", "login.defs")


def account_root(base: Path) -> Path:
    """`base/root` holding copies of this machine's account databases, for writes that add an account."""
    root = base / "root"
    (root / "etc").mkdir(parents=True)
    for name in ACCOUNT_FILES:
        shutil.copy2(Path("/etc") / name, root / "etc" / name)
    return root


def tree_state(root: Path) -> dict[str, Any]:
    """Every entry under `root`: content, link target, mode and type; nothing followed."""
    state: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                state[str(path)] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                state[str(path)] = ("file", st.st_mode, path.read_bytes())
            else:
                state[str(path)] = ("other", st.st_mode)
    return state
