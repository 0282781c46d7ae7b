"""`rocmdoctor snapshot`: the files the checks read, as an archive that `--root` replays."""

from __future__ import annotations

from pathlib import Path

import click

from .. import params
from .check import check_context
from .common import App, UserError, pass_app


@click.command()
@click.argument("out", type=params.NonEmptyPath(dir_okay=False, writable=True, path_type=Path))
@click.option(
    "--user",
    default=None,
    type=params.UserName(),
    help="Also keep this user's account lines (as for check --user).",
)
@params.prefix_option("Install prefix whose free space is kept.")
@pass_app
def snapshot(app: App, out: Path, user: str | None, prefix: str) -> None:
    """Write the files the checks read to OUT (.tar.gz); `rocmdoctor --root OUT check` replays it."""
    from ..checks import load_registry
    from ..checks.capture import capture_facts
    from ..snapshot import snapshot as take_snapshot

    if not out.name.endswith((".tar.gz", ".tgz")):
        raise UserError(f"{out}: name the archive *.tar.gz")
    if not out.resolve().parent.is_dir():
        raise UserError(f"{out.parent} does not exist; create it or write the snapshot elsewhere")
    ctx = check_context(app, user, 8000, prefix)
    try:
        snap = take_snapshot(ctx, load_registry().specs, capture_facts(ctx), out)
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
    click.echo(
        f"wrote {out}: {len(snap.files)} files, {len(snap.links)} links, {len(snap.stat)} stat entries",
        err=True,
    )
