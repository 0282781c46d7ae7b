"""`rocmdoctor explain`: from a log a user has to the cause, and the host check that proves or rules it out."""

from __future__ import annotations

import sys
from typing import Any

import click

from rocmdoctor import params
from rocmdoctor.commands.common import App, UserError, emit_json, pass_app
from rocmdoctor.commands.explain_input import InputError


class _UnitName(click.ParamType):
    name = "unit"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from rocmdoctor.commands.explain_input import unit_name

        try:
            return unit_name(str(value))
        except InputError as exc:
            self.fail(str(exc), param, ctx)


@click.command()
@click.argument("logs", nargs=-1, metavar="[LOG ...]")
@click.option(
    "--unit", "units", multiple=True, type=_UnitName(), help="A systemd unit's journal since its last start."
)
@click.option(
    "--lemonade",
    is_flag=True,
    help="Lemonade's server log (the journal of lemond.service or lemonade-server.service).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the versioned JSON document on stdout.")
@click.option(
    "--port", default=8000, show_default=True, type=params.Port(), help="The port the server was to serve on."
)
@pass_app
def explain(
    app: App, logs: tuple[str, ...], units: tuple[str, ...], lemonade: bool, as_json: bool, port: int
) -> None:
    """Name the causes in a vLLM/ROCm/Lemonade log (files, - for stdin) and check each on this host.

    Exit 0: nothing wrong found; 1: a cause found, or error lines no known cause explains; 2: bad input."""
    from rocmdoctor.commands.explain_input import lemonade_unit, read_journal, read_path

    if not logs and not units and not lemonade:
        raise UserError("give a log file, - for stdin, --unit NAME or --lemonade")
    if (units or lemonade) and str(app.root) != "/":
        raise UserError(
            f"--unit/--lemonade read this machine's journal, not --root {app.root}; give the log as a file"
        )
    try:
        scans = [read_path(name) for name in logs]
        if units or lemonade:
            host = app.host()
            journals = [*units, *([lemonade_unit(host)] if lemonade else [])]
            scans += [read_journal(host, unit) for unit in journals]
    except InputError as exc:
        raise UserError(str(exc)) from None
    from rocmdoctor.commands.explain_report import build_report

    report = build_report(app, scans, port)
    exit_code = report["exit_code"]
    if as_json:
        emit_json(report)
    else:
        from rocmdoctor.rendering.explain_text import render

        click.echo(render(report, app.verbose), nl=False)
    sys.exit(exit_code)
