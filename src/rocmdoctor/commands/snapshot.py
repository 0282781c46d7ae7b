"""`rocmdoctor snapshot`: the files the checks read, as an archive that `--root` replays."""

from __future__ import annotations

from pathlib import Path

import click

from rocmdoctor import params
from rocmdoctor.commands.check_context import check_context
from rocmdoctor.commands.common import App, UserError, pass_app


@click.command()
@click.argument("out", type=params.NonEmptyPath(dir_okay=False, writable=True, path_type=Path))
@click.option(
    "--user",
    default=None,
    type=params.UserName(),
    help="Also keep this user's account lines (as for check --user).",
)
@click.option("--port", default=8000, show_default=True, type=params.Port(), help="As for check --port.")
@params.prefix_option("As for check --prefix: the bundle and free space the run reads there are kept.")
@pass_app
def snapshot(app: App, out: Path, user: str | None, port: int, prefix: str) -> None:
    """Write the files the checks read to OUT (.tar.gz); `rocmdoctor --root OUT check` replays it.

    Give the options you give `check` (--user, --port, --prefix): the checks run with them first,
    and what that run read is what is kept."""
    from rocmdoctor.checks import load_registry
    from rocmdoctor.checks.capture import capture_facts
    from rocmdoctor.snapshot import snapshot as take_snapshot

    if not out.name.endswith((".tar.gz", ".tgz")):
        raise UserError(f"{out}: name the archive *.tar.gz")
    if not out.resolve().parent.is_dir():
        raise UserError(f"{out.parent} does not exist; create it or write the snapshot elsewhere")
    ctx = check_context(app, user, port, prefix)
    try:
        specs = load_registry().specs
        snap = take_snapshot(ctx, specs, capture_facts(ctx, specs), out)
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
    click.echo(
        f"wrote {out}: {len(snap.files)} files, {len(snap.links)} links, {len(snap.stat)} stat entries",
        err=True,
    )
