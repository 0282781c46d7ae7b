"""What a killed run leaves behind, and how the next run recognises it.

Every temp file, temp link and private tree rocmdoctor makes carries its owner's pid in its name:
`.<name>.tmp-<pid>-<random>` beside the file it will replace, `rocmdoctor-replay-<pid>-<random>` in
TMPDIR. `sweep` removes those whose owner is gone (no such process); a live owner's are left alone, and
a reused pid only delays the removal (it errs on keeping). A link is removed, never followed.

Only the names live here; the sweep that removes litter (`atomic.sweep`) is the write seam's own.
"""

from __future__ import annotations

import os
import re
import secrets

REPLAY_PREFIX = "rocmdoctor-replay-"
_OWNER = re.compile(r"(?:\.tmp-|^rocmdoctor-replay-)([0-9]{1,10})-[0-9a-zA-Z_]+$")


def temp_name(name: str) -> str:
    """The temp name for replacing `name` in the same directory, marked with our pid."""
    return f".{name}.tmp-{os.getpid()}-{secrets.token_hex(6)}"


def owner_pid(entry: str) -> int | None:
    match = _OWNER.search(entry)
    return int(match.group(1)) if match else None
