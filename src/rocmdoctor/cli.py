"""The `rocmdoctor` command line: global options and lazily imported command modules.

Commands are thin: they parse, call one core function that returns data, and render it.
A command's module is imported only when that command runs, so `check` stays fast.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from . import __version__

# name -> "module:attribute" (relative to rocmdoctor.commands)
COMMANDS: dict[str, str] = {
    "check": "check:check",
    "fix-kernel": "check:fix_kernel",
    "snapshot": "check:snapshot",
    "install": "bundle:install",
    "rollback": "bundle:rollback",
    "bundles": "bundle:bundles",
    "bundle": "bundle:bundle",
    "unit": "serve:unit",
    "serve": "serve:serve",
    "smoke": "smoke:smoke",
    "bench": "smoke:bench",
    "plan": "plan:plan",
}


class UserError(click.ClickException):
    """Bad input or an unmet precondition: a clear message and exit 2, never a traceback."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"rocmdoctor: {self.format_message()}", err=True)


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        module = importlib.import_module(f"rocmdoctor.commands.{module_name}")
        return getattr(module, attr)


@dataclass
class App:
    """Global options, handed to every command through click's context object."""

    root: Path
    verbose: int
    no_color: bool

    def host(self) -> Any:
        from .host import Host, RootError

        root = self.root
        if root.is_file():
            from .snapshot import SnapshotError, unpack

            try:
                root = unpack(root)
            except SnapshotError as exc:
                raise UserError(str(exc)) from None
        try:
            return Host(root)
        except RootError as exc:
            raise UserError(f"{exc}; point --root (or ROCMDOCTOR_ROOT) at a directory or a snapshot archive") from None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rocmdoctor")
@click.option(
    "--root",
    type=click.Path(path_type=Path),
    default="/",
    envvar="ROCMDOCTOR_ROOT",
    show_default=True,
    help="Read the host through this directory or `rocmdoctor snapshot` archive. [env var: ROCMDOCTOR_ROOT]",
)
@click.option("-v", "--verbose", count=True, help="Show details under each line (-vv: more).")
@click.option("--no-color", is_flag=True, help="No colour (NO_COLOR is honoured too).")
@click.pass_context
def cli(ctx: click.Context, root: Path, verbose: int, no_color: bool) -> None:
    """Diagnose an AMD ROCm host for vLLM, install the vllm-rocm bundle, serve and verify it."""
    ctx.obj = App(root=root, verbose=verbose, no_color=no_color)


def main() -> None:
    try:
        cli.main(prog_name="rocmdoctor", standalone_mode=True)
    except KeyboardInterrupt:
        click.echo("rocmdoctor: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no tracebacks for users
        if os.environ.get("ROCMDOCTOR_DEBUG"):
            raise
        click.echo(
            f"rocmdoctor: internal error: {type(exc).__name__}: {exc}\n"
            "This is a rocmdoctor bug; rerun with ROCMDOCTOR_DEBUG=1 for the traceback and report it.",
            err=True,
        )
        sys.exit(2)
