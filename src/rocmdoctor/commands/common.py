"""Small helpers the command modules share."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from rocmdoctor.cli import App, UserError
from rocmdoctor.report import dumps

__all__ = [
    "WITH_ROOT_FACTS",
    "App",
    "UserError",
    "echo_write_report",
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


def echo_write_report(
    report: Any,
    check_only: bool,
    label: Callable[[str, Any], str] = lambda word, change: word,
    restart: Sequence[str] = (),
) -> None:
    """What `unit --write` and `instances --write` did (or, with --check, would do): each file and its
    diff, the accounts created, daemon-reload, the instances to restart, and `changed=`."""
    word = "would change" if check_only else "changed"
    for change in report.files:
        click.echo(f"{label(word, change) if change.changed else 'ok'} {change.path}")
        if change.diff:
            click.echo(change.diff.rstrip("\n"))
    for account in report.accounts:
        click.echo(f"{'would create' if check_only else 'created'} {account}")
    click.echo(f"daemon-reload: {report.daemon_reload}")
    if restart:
        click.echo("restart to apply: " + " ".join(f"vllm@{n}" for n in restart))
    click.echo(f"changed={str(report.changed).lower()}")
