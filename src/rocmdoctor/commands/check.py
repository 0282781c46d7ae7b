"""`rocmdoctor check`: diagnosis of this host."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rocmdoctor import params
from rocmdoctor.commands.check_context import check_context, choose_gpus
from rocmdoctor.commands.common import App, UserError, emit_json, pass_app
from rocmdoctor.commands.server_options import server_option

if TYPE_CHECKING:
    from rocmdoctor.registry import CheckSpec, Context


def host_capacity(ctx: Context) -> dict[str, Any]:
    """The layouts this host's GPUs allow and each instance's memory (provision.capacity), from the
    same device records `instances` lays servers out on, so check and instances cannot disagree."""
    from rocmdoctor.commands.host_devices import host_devices
    from rocmdoctor.provision.server.capacity import capacity

    return capacity(host_devices(ctx), ctx.options.gpus)


def write_health(ctx: Context, report: dict[str, Any], started: float, path: Path) -> None:
    from rocmdoctor import __version__
    from rocmdoctor.commands.health_textfile import health_run, write_textfile
    from rocmdoctor.rendering.rows import row_lines
    from rocmdoctor.rendering.textfile import render, render_failed
    from rocmdoctor.vllm.health_metrics import PROBE_OK

    try:
        run = health_run(ctx, report, started)
    except Exception as exc:
        # A bug of rocmdoctor's, not a finding about the host: the file says so in rocmdoctor_up 0
        # (an alert on the value at once, not only when the file goes stale), the journal says why.
        write_textfile(path, render_failed(__version__, time.time()))
        raise UserError(
            f"the health run failed ({type(exc).__name__}: {exc}); {path} says rocmdoctor_up 0"
        ) from exc
    write_textfile(path, render(run))
    down = [server.row() for server in run.servers if server.verdict != PROBE_OK]
    click.echo(
        f"wrote {path}: {len(run.checks)} checks, {report['summary'].get('fail', 0)} failed, "
        f"{len(run.servers)} servers" + (f", {len(down)} not serving:" if down else ""),
        err=True,
    )
    for line in row_lines(down):
        click.echo(line, err=True)


def show_checks(specs: list[CheckSpec], as_json: bool) -> None:
    """`check --list`: every check's id and title."""
    from rocmdoctor.model import envelope
    from rocmdoctor.report import list_checks as list_specs

    if as_json:
        emit_json(envelope(checks=list_specs(specs)))
        return
    for spec in specs:
        click.echo(f"{spec.id:<22} {spec.title}")


def refuse_textfile(textfile: Path) -> None:
    """A --textfile the collector could not read (or that is not ours to replace): exit 2, before any check."""
    from rocmdoctor.commands.health_textfile import textfile_problem

    problem = textfile_problem(textfile)
    if problem:
        raise UserError(f"--textfile {textfile}: {problem}")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the versioned JSON report on stdout.")
@click.option(
    "--only", multiple=True, metavar="PATTERN", help="Run only checks whose id or group matches (glob)."
)
@click.option(
    "--skip", multiple=True, metavar="PATTERN", help="Leave out checks whose id or group matches (glob)."
)
@click.option("--list-checks", is_flag=True, help="List the checks and what each reads, then exit.")
@click.option(
    "--user",
    default=None,
    type=params.UserName(),
    help="Whose access to /dev/kfd and render nodes to check (default: you).",
)
@click.option(
    "--port", default=8000, show_default=True, type=params.Port(), help="The port vLLM will serve on."
)
@params.prefix_option("Where bundles are installed.")
@click.option(
    "--model",
    default=None,
    type=params.ModelName(),
    help="A local model directory or a Hugging Face id in the cache: disk.space counts its weights "
    "(exact, from the safetensors headers; no download).",
)
@click.option("--deep", is_flag=True, help="Also probe the GPU through the bundle's own PyTorch (slow).")
@click.option(
    "--python",
    "python",
    default=None,
    metavar="PATH",
    type=params.NonEmptyPath(dir_okay=False),
    help="Interpreter for --deep (default: <prefix>/current/bin/python3).",
)
@click.option(
    "--deep-timeout",
    type=params.Duration(max_s=3600, min_s=1, inclusive=True),
    default=None,
    metavar="SECONDS",
    help="How long the --deep probe may take before it is killed (default 180).",
)
@click.option(
    "--textfile",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="PATH",
    help="Write the diagnosis, GPU memory, the active bundle and each managed server's health as "
    "Prometheus text for node_exporter's textfile collector (a *.prom file, replaced atomically); "
    "exit 0 once written, whatever it found.",
)
@server_option("gpu", help="Judge these GPUs as the ones vLLM will serve (PCI slot or node:N; repeatable).")
@pass_app
def check(
    app: App,
    as_json: bool,
    only: tuple[str, ...],
    skip: tuple[str, ...],
    list_checks: bool,
    user: str | None,
    port: int,
    prefix: str,
    model: str | None,
    deep: bool,
    python: str | None,
    deep_timeout: float | None,
    textfile: Path | None,
    gpus: tuple[str, ...] = (),
) -> None:
    """Diagnose this host for vLLM on ROCm. Exit 0: no failure; 1: a failure; 2: could not run."""
    from rocmdoctor.checks import host_facts, load_registry
    from rocmdoctor.registry import SelectionError
    from rocmdoctor.report import build_report

    registry = load_registry()
    if list_checks:
        show_checks(registry.specs, as_json)
        return
    try:
        specs = registry.select(only, skip, include_optional=deep)
    except SelectionError as exc:
        raise UserError(str(exc)) from None
    if textfile is not None:
        refuse_textfile(textfile)
    started = time.monotonic()
    ctx = check_context(app, user, port, prefix, python, deep_timeout)
    choose_gpus(ctx, gpus)
    if model is not None:
        from rocmdoctor.vllm.model_files import weights_bytes_offline

        ctx.options.model_bytes = weights_bytes_offline(model, env=ctx.host.env) or 0
    outcomes = registry.run(ctx, specs)
    report = build_report(str(ctx.host.root), host_facts(ctx), outcomes)
    if textfile is not None:
        write_health(ctx, report, started, textfile)
        if not as_json:
            return  # the timer's run: the layouts (capacity) are for people and --json only
    report["capacity"] = host_capacity(ctx)
    if as_json:
        emit_json(report)
    else:
        from rocmdoctor.rendering.check_text import render_check_report
        from rocmdoctor.rendering.console import make_console

        render_check_report(report, make_console(no_color=app.no_color), app.verbose)
    sys.exit(report["exit_code"])
