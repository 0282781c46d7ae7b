"""`rocmdoctor check` (and, with it, `fix-kernel` and `snapshot`): diagnosis of this host."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..registry import DEFAULT_PREFIX
from .common import App, UserError, emit_json, pass_app


def _context(app: App, user: str | None, port: int, prefix: str, python: str | None = None,
             deep_timeout: float | None = None):
    from ..registry import Context, Options

    options = Options(user=user, port=port, prefix=prefix, python=python)
    if deep_timeout is not None:
        options.deep_timeout_s = deep_timeout
    return Context(app.host(), options)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the versioned JSON report on stdout.")
@click.option("--only", multiple=True, metavar="PATTERN", help="Run only checks whose id or group matches (glob).")
@click.option("--skip", multiple=True, metavar="PATTERN", help="Leave out checks whose id or group matches (glob).")
@click.option("--list-checks", is_flag=True, help="List the checks and what each reads, then exit.")
@click.option("--user", default=None, help="Whose access to /dev/kfd and render nodes to check (default: you).")
@click.option("--port", default=8000, show_default=True, help="The port vLLM will serve on.")
@click.option("--prefix", default=DEFAULT_PREFIX, envvar="ROCMDOCTOR_PREFIX", show_default=True,
              help="Where bundles are installed. [env: ROCMDOCTOR_PREFIX]")
@click.option("--deep", is_flag=True, help="Also probe the GPU through the bundle's own PyTorch (slow).")
@click.option("--python", "python", default=None, metavar="PATH",
              help="Interpreter for --deep (default: <prefix>/current/bin/python3).")
@click.option("--deep-timeout", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="How long the --deep probe may take before it is killed (default 180).")
@pass_app
def check(app: App, as_json: bool, only: tuple[str, ...], skip: tuple[str, ...], list_checks: bool,
          user: str | None, port: int, prefix: str, deep: bool, python: str | None,
          deep_timeout: float | None) -> None:
    """Diagnose this host for vLLM on ROCm. Exit 0: no failure; 1: a failure; 2: could not run."""
    from ..checks import host_facts, load_registry
    from ..model import envelope
    from ..registry import SelectionError
    from ..report import build_report
    from ..report import list_checks as list_specs

    registry = load_registry()
    if list_checks:
        specs = registry.specs
        if as_json:
            emit_json(envelope(checks=list_specs(specs)))
        else:
            for spec in specs:
                click.echo(f"{spec.id:<22} {spec.title}")
        return
    try:
        specs = registry.select(only, skip, include_optional=deep)
    except SelectionError as exc:
        raise UserError(str(exc)) from None
    ctx = _context(app, user, port, prefix, python, deep_timeout)
    outcomes = registry.run(ctx, specs)
    report = build_report(str(ctx.host.root), host_facts(ctx), outcomes)
    if as_json:
        emit_json(report)
    else:
        from ..console import make_console
        from ..render import render_check_report

        render_check_report(report, make_console(no_color=app.no_color), app.verbose)
    sys.exit(report["exit_code"])


@click.command("fix-kernel")
@click.option("--json", "as_json", is_flag=True, help="Print the guidance as JSON on stdout.")
@click.option("--user", default=None, help="Whose view to take (as for check).")
@pass_app
def fix_kernel(app: App, as_json: bool, user: str | None) -> None:
    """Print the commands that give this host a kernel, driver and TTM limit fit for vLLM (changes nothing).
    Exit 0: nothing to fix; 1: steps to take."""
    from ..checks import load_registry
    from ..checks.facts import distro_info, kernel_release
    from ..checks.kernel_guidance import GUIDED_CHECKS, Finding, guidance

    registry = load_registry()
    ctx = _context(app, user, 8000, DEFAULT_PREFIX)
    outcomes = registry.run(ctx, registry.select(only=GUIDED_CHECKS))
    findings = {
        o.spec.id: Finding(o.result.status.value, o.result.summary, o.result.details, o.result.remedy)
        for o in outcomes
    }
    document = guidance(distro_info(ctx), kernel_release(ctx), findings)
    if as_json:
        emit_json(document)
    else:
        click.echo(document["headline"])
        for number, step in enumerate(document["steps"], 1):
            click.echo(f"\n{number}. {step['title']}\n   why: {step['why']}")
            click.echo("   run:")
            for command in step["commands"]:
                click.echo(f"     {command}")
            click.echo("   verify after the reboot:")
            for command in step["verify"]:
                click.echo(f"     {command}")
    sys.exit(1 if document["needs_fixing"] else 0)


@click.command()
@click.argument("out", type=click.Path(dir_okay=False, writable=True, path_type=Path))
@click.option("--user", default=None, help="Also keep this user's account lines (as for check --user).")
@click.option("--prefix", default=DEFAULT_PREFIX, envvar="ROCMDOCTOR_PREFIX", show_default=True,
              help="Install prefix whose free space is kept. [env: ROCMDOCTOR_PREFIX]")
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
    ctx = _context(app, user, 8000, prefix)
    try:
        snap = take_snapshot(ctx, load_registry().specs, capture_facts(ctx), out)
    except OSError as exc:
        raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
    click.echo(f"wrote {out}: {len(snap.files)} files, {len(snap.links)} links, {len(snap.stat)} stat entries",
               err=True)
