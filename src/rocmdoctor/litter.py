"""What a killed run leaves behind, and how the next run recognises it.

Every temp file, temp link and private tree rocmdoctor makes carries its owner's pid in its name:
`.<name>.tmp-<pid>-<random>` beside the file it will replace, `rocmdoctor-replay-<pid>-<random>` in
TMPDIR. `sweep` removes those whose owner is gone (no such process); a live owner's are left alone, and
a reused pid only delays the removal (it errs on keeping). A link is removed, never followed.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import stat
from pathlib import Path

REPLAY_PREFIX = "rocmdoctor-replay-"
_OWNER = re.compile(r"(?:\.tmp-|^rocmdoctor-replay-)([0-9]{1,10})-[0-9a-zA-Z_]+$")


def temp_name(name: str) -> str:
    """The temp name for replacing `name` in the same directory, marked with our pid."""
    return f".{name}.tmp-{os.getpid()}-{secrets.token_hex(6)}"


def owner_pid(entry: str) -> int | None:
    match = _OWNER.search(entry)
    return int(match.group(1)) if match else None


def owner_gone(pid: int) -> bool:
    if pid == os.getpid() or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: alive, someone else's
        return False
    return False


def remove_entry(path: Path) -> None:
    """A file or link unlinked, a directory removed as a tree (links inside never followed)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def sweep(directory: Path, prefix: str) -> list[str]:
    """Remove the entries of `directory` named `prefix`... whose owner pid is gone; their names."""
    removed: list[str] = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for entry in names:
        if not entry.startswith(prefix):
            continue
        pid = owner_pid(entry)
        if pid is not None and owner_gone(pid):
            remove_entry(directory / entry)
            removed.append(entry)
    return removed
