"""`rocmdoctor smoke`: prove the served model works (and the options `bench` shares with it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from rocmdoctor.commands.common import App, emit_json, pass_app
from rocmdoctor.commands.smoke_options import (
    _all_instances,
    _api_key,
    _common_options,
    _url,
    refuse_with_all_instances,
)


def _context_options(fn: Any) -> Any:
    from rocmdoctor.provision.verify.context_probe import DEFAULT_BUDGET_TOKENS, DEFAULT_DTYPE, TOLERANCE_NATS

    fn = click.option(
        "--context-boundary",
        "boundaries",
        type=click.IntRange(min=1),
        multiple=True,
        help="A length where the server's kernels change (its --max-num-batched-tokens, the model's "
        "sliding window); checked at N and N+1. Repeatable.",
    )(fn)
    fn = click.option(
        "--dtype",
        type=click.Choice(sorted(TOLERANCE_NATS)),
        default=DEFAULT_DTYPE,
        show_default=True,
        help="The dtype the server computes in (sets the log-probability tolerance).",
    )(fn)
    fn = click.option(
        "--context-probe",
        type=click.Choice(["auto", "on", "off"]),
        default="auto",
        show_default=True,
        help=f"Check long-context answers (prefill vs decode, needle) on a ladder of lengths: auto up to "
        f"{DEFAULT_BUDGET_TOKENS} prompt tokens, on up to max_model_len.",
    )(fn)
    return fn


@click.command()
@_common_options
@_all_instances
@_context_options
@click.option("--json", "as_json", is_flag=True, help="Print the versioned JSON report on stdout.")
@pass_app
def smoke(
    app: App,
    url: str,
    model: str,
    api_key_file: Path | None,
    timeout_s: float | None,
    all_instances: bool,
    context_probe: str,
    dtype: str,
    boundaries: tuple[int, ...],
    as_json: bool,
) -> None:
    """Prove that a vLLM server really serves: health, models, completions, chat, streaming, metrics.

    Exit 0: every step passed (warnings allowed); 1: a step failed; 2: bad input or nothing answers.
    """
    from rocmdoctor.provision.verify.smoke import SmokeOptions, run_smoke

    if all_instances:
        from rocmdoctor.commands.instances_setup import smoke_instances
        from rocmdoctor.host_writes import HostWriter

        refuse_with_all_instances("url", "model", "api_key_file", "timeout_s")
        smoke_instances(HostWriter(app.root), None, as_json)

    options = SmokeOptions(
        _url(url),
        model,
        _api_key(api_key_file),
        timeout_s or 30.0,
        context_probe=context_probe,
        dtype=dtype,
        boundaries=boundaries,
    )
    report = run_smoke(options)
    if as_json:
        emit_json(report)
    else:
        from rocmdoctor.commands.smoke_render import render_smoke
        from rocmdoctor.rendering.console import make_console

        render_smoke(report, make_console(no_color=app.no_color), app.verbose)
    sys.exit(report["exit_code"])
