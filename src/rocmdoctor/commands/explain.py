"""`rocmdoctor explain`: from a log a user has to the cause, and the host check that proves or rules it out."""

from __future__ import annotations

import sys
from typing import Any

import click

from rocmdoctor import params
from rocmdoctor.commands.common import App, UserError, emit_json, pass_app
from rocmdoctor.commands.explain_input import InputError, SourceScan


def causes_of(scans: list[SourceScan]) -> list[dict[str, Any]]:
    """One entry per cause over all logs, in the table's priority order, with its evidence lines."""
    from rocmdoctor.sensitive import redact_message
    from rocmdoctor.vllm.log_signatures import signatures

    found: dict[str, dict[str, Any]] = {}
    for source in scans:
        for cause_id, ev in source.scan.evidence.items():
            sig = ev.signature
            entry = found.setdefault(
                cause_id,
                {
                    "id": cause_id,
                    "summary": sig.summary,
                    "remedy": redact_message(sig.remedy_for(ev.first.match)),
                    "host_problem": sig.host_problem,
                    "source": sig.source,
                    "checks": list(sig.checks),
                    "matches": 0,
                    "evidence": [],
                },
            )
            entry["matches"] += ev.count
            entry["evidence"] += [_line(source.name, line) for line in ev.lines]
    rank = {s.id: i for i, s in enumerate(signatures())}
    return sorted(found.values(), key=lambda c: rank[c["id"]])


def _line(log: str, line: Any) -> dict[str, Any]:
    from rocmdoctor.sensitive import redact_message

    return {"log": log, "line": line.number, "offset": line.offset, "text": redact_message(line.text)}


def judge(app: App, causes: list[dict[str, Any]], port: int) -> None:
    """Each cause's checks run on this host (or --root); ruled-out causes move after the others."""
    from rocmdoctor.commands.check import check_context
    from rocmdoctor.commands.explain_host import RULED_OUT, run_checks, verdict
    from rocmdoctor.registry import DEFAULT_PREFIX

    wanted = {c for cause in causes if cause["host_problem"] for c in cause["checks"]}
    outcomes = run_checks(check_context(app, None, port, DEFAULT_PREFIX), wanted) if wanted else {}
    for cause in causes:
        cause["host"] = verdict(tuple(cause["checks"]), cause["host_problem"], outcomes).to_json()
    causes.sort(key=lambda c: c["host"]["verdict"] == RULED_OUT)


def source_json(source: SourceScan) -> dict[str, Any]:
    scan = source.scan
    return {
        "name": source.name,
        "kind": source.kind,
        "bytes_read": scan.bytes_read,
        "lines": scan.lines,
        "cut": source.cut or None,
        "skipped": [{"offset": offset, "bytes": size} for offset, size in scan.skipped],
        "overlong_lines": scan.overlong_lines,
        "binary": scan.binary_bytes > 0,
    }


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
    from rocmdoctor.model import envelope

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
    causes = causes_of(scans)
    judge(app, causes, port)
    unexplained = [] if causes else [_line(s.name, line) for s in scans for line in s.scan.error_like()]
    exit_code = 1 if causes or unexplained else 0
    report = envelope(
        root=str(app.root),
        sources=[source_json(s) for s in scans],
        causes=causes,
        unexplained=unexplained,
        exit_code=exit_code,
    )
    if as_json:
        emit_json(report)
    else:
        from rocmdoctor.rendering.explain_text import render

        click.echo(render(report, app.verbose), nl=False)
    sys.exit(exit_code)
