"""The one people-facing rendering of a Change (model.Change), for every command that changes
something: what the command lists above it (its files, models, verify rows) is the command's; the
diff, the message and the closing `changed=` line are rendered here, the same way everywhere."""

from __future__ import annotations

from collections.abc import Sequence

from rocmdoctor.model import Change


def change_text(change: Change, details: Sequence[str] = (), with_diff: bool = True) -> str:
    """`details` (one line each), the diff (a unified diff as it is, a state diff a `-`/`+` line per
    field; left out where the command showed it before asking to apply), the message, then
    `changed=true|false`."""
    lines = list(details)
    diff = change.diff_text().rstrip("\n") if with_diff else ""
    if diff:
        lines.append(diff)
    if change.msg:
        lines.append(change.msg)
    lines.append(f"changed={str(change.changed).lower()}")
    return "\n".join(lines)
