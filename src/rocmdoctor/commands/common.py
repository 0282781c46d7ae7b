"""Small helpers the command modules share."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from rocmdoctor.cli import App, UserError
from rocmdoctor.model import Change
from rocmdoctor.rendering.change_text import change_text
from rocmdoctor.report import dumps

__all__ = [
    "WITH_ROOT_FACTS",
    "App",
    "UserError",
    "echo_write_report",
    "emit_change",
    "emit_json",
    "pass_app",
    "refuse_root_facts_for_live_action",
    "write_root",
]

pass_app = click.make_pass_decorator(App)

WITH_ROOT_FACTS = click.option(
    "--with-root-facts",
    is_flag=True,
    help="With another --root: act on THIS host using the facts read under --root (a snapshot, an image). "
    "Without it such a mix is refused.",
)


def refuse_root_facts_for_live_action(app: App, with_root_facts: bool, action: str) -> None:
    """A command that acts on this host (starts a server, installs into a prefix) from facts it read: under
    another --root those are another host's facts, so it refuses unless the user asked for exactly that."""
    if app.root != Path("/") and not with_root_facts:
        raise UserError(
            f"--root {app.root} is another host's facts, and {action} acts on this host: pass "
            f"--with-root-facts to {action} here with those facts, or leave --root out"
        )


def write_root(app: App, target: Path | None) -> Path:
    """Where a command that writes writes: `--target`, else this host. `--root` only reads, so a command
    given another root writes only when told where (`--target`, `/` included)."""
    if target is not None:
        return target
    if app.root != Path("/"):
        raise UserError(
            f"--root {app.root} only reads the host: pass --target {app.root} to write into that tree, "
            "or leave --root out to write on this host"
        )
    return Path("/")


def emit_json(document: Any) -> None:
    sys.stdout.write(dumps(document))
    sys.stdout.flush()


def emit_change(
    change: Change, as_json: bool, details: Sequence[str] = (), with_diff: bool = True, **extra: Any
) -> None:
    """A changing command's result: with --json the one envelope (and the command's own fields); for
    people the one rendering of a Change (rendering/change_text.py) under the command's `details`
    (`with_diff=False` where the command showed the diff before asking to apply it)."""
    if as_json:
        emit_json(change.envelope(**extra))
    else:
        click.echo(change_text(change, details, with_diff))


def echo_write_report(
    report: Any,
    label: Callable[[str, Any], str] = lambda word, change: word,
    restart: Sequence[str] = (),
) -> None:
    """What `unit --write` and `instances --write` did (or, with --check, would do): each file, then
    daemon-reload and the instances to restart, then the Change (the files' diffs, the message naming
    the accounts created, `changed=`)."""
    word = "would change" if report.check else "changed"
    details = [f"{label(word, f) if f.changed else 'ok'} {f.path}" for f in report.files]
    details.append(f"daemon-reload: {report.daemon_reload}")
    if restart:
        details.append("restart to apply: " + " ".join(f"vllm@{n}" for n in restart))
    click.echo(change_text(report.change(), details))
