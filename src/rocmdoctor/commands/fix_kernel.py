"""`rocmdoctor fix-kernel`: distro-specific steps for the kernel, driver and TTM findings (changes nothing)."""

from __future__ import annotations

import sys

import click

from rocmdoctor import params
from rocmdoctor.commands.check_context import check_context
from rocmdoctor.commands.common import App, emit_json, pass_app
from rocmdoctor.registry import DEFAULT_PREFIX


@click.command("fix-kernel")
@click.option("--json", "as_json", is_flag=True, help="Print the guidance as JSON on stdout.")
@click.option("--user", default=None, type=params.UserName(), help="Whose view to take (as for check).")
@pass_app
def fix_kernel(app: App, as_json: bool, user: str | None) -> None:
    """Print the commands that give this host a kernel, driver and TTM limit fit for vLLM (changes nothing).
    Exit 0: nothing to fix; 1: steps to take."""
    from rocmdoctor.checks import load_registry
    from rocmdoctor.checks.facts import distro_info, kernel_release
    from rocmdoctor.checks.kernel_guidance import GUIDED_CHECKS, Finding, guidance

    registry = load_registry()
    ctx = check_context(app, user, 8000, DEFAULT_PREFIX)
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
