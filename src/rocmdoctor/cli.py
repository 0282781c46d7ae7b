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

from rocmdoctor import __version__

# name -> "module:attribute" (relative to rocmdoctor.commands)
COMMANDS: dict[str, str] = {
    "check": "check:check",
    "fix-kernel": "fix_kernel:fix_kernel",
    "snapshot": "snapshot:snapshot",
    "install": "install:install",
    "rollback": "install:rollback",
    "bundles": "bundle:bundles",
    "bundle": "bundle:bundle",
    "unit": "serve:unit",
    "serve": "serve:serve",
    "smoke": "smoke:smoke",
    "bench": "bench:bench",
    "instances": "instances:instances",
    "plan": "plan:plan",
    "lemonade": "lemonade:lemonade",
    "fix": "fix:fix",
    "tune": "tune:tune",
    "cluster": "cluster:cluster",
    "explain": "explain:explain",
    "upgrade": "upgrade:upgrade",
}


class UserError(click.ClickException):
    """Bad input or an unmet precondition: a clear message and exit 2, never a traceback."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        from rocmdoctor.sensitive import redact_message

        click.echo(f"rocmdoctor: {redact_message(self.format_message())}", err=True)


def _app(ctx: click.Context) -> App:
    app = ctx.find_object(App)
    if app is None:  # a command invoked without the group (tests calling it directly)
        app = ctx.ensure_object(App)
    return app


def _set_root(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        _app(ctx).set_root(value)


def _add_verbose(ctx: click.Context, _param: click.Parameter, value: int) -> None:
    if value:
        _app(ctx).verbose += value


def _set_no_color(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        _app(ctx).no_color = True


def _again(declarations: list[str], callback: Any, **kind: Any) -> click.Option:
    """A global option once more on a subcommand: eager, so it sets the App before the command's own."""
    return click.Option(
        declarations,
        expose_value=False,
        is_eager=True,
        callback=callback,
        help=f"Same as the global {declarations[0]}.",
        **kind,
    )


def _global_options() -> list[click.Option]:
    """The group's options, accepted after the subcommand too (`check --root X -v`)."""
    return [
        _again(["--root"], _set_root, type=str, default=None),
        _again(["-v", "--verbose"], _add_verbose, count=True),
        _again(["--no-color"], _set_no_color, is_flag=True),
    ]


def with_global_options(command: click.Command) -> click.Command:
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            with_global_options(sub)
        return command
    taken = {opt for param in command.params for opt in getattr(param, "opts", ())}
    for option in _global_options():
        if not taken.intersection(option.opts):
            command.params.append(option)
    return command


# Errors whose text is meant for the user (it names the file, the value, the field), by class, with what
# to do: wherever a command lets one through, it is a clear exit 2, never "internal error". A subclass
# takes its nearest listed class's advice; an OSError says its file and reason.
KNOWN_ERRORS: dict[str, str] = {
    "rocmdoctor.host_writes.WriteRefused": "rocmdoctor writes only regular files it can reach without "
    "following a link: move the link or file aside, or give another --target",
    "rocmdoctor.host.RootError": "point --root (or ROCMDOCTOR_ROOT), or --target, at a directory",
    "rocmdoctor.documents.DocumentError": "replace the document named, or point the option at the right one",
    "rocmdoctor.sensitive.KeyFileError": "",
    "rocmdoctor.facts.manifest.ManifestError": "fix the manifest, or leave --bundles-dir out",
    "rocmdoctor.snapshot.SnapshotError": "give an archive `rocmdoctor snapshot` wrote",
    "rocmdoctor.host_files.UnsafeDirectory": "rocmdoctor uses only directories it owns: fix the owner or "
    "mode named, or choose another directory",
    "rocmdoctor.host_files.ForeignFile": "it is not rocmdoctor's: move it aside",
    "rocmdoctor.archive.tar_rule.UnsafeArchive": "the archive is refused: use one from the bundle's release",
    "rocmdoctor.registry.SelectionError": "`rocmdoctor check --list` names the checks",
    "rocmdoctor.cluster.layout.ClusterLayoutError": "",
    "rocmdoctor.vllm.model_files.ModelFilesError": "check the model's files (`rocmdoctor plan --model`)",
    "rocmdoctor.vllm.layers.ConfigError": "check the model's config.json",
    "rocmdoctor.provision.server.layout.LayoutError": "",
    "rocmdoctor.provision.server.args.ArgumentError": "",
    "rocmdoctor.provision.server.unit_syntax.UnitError": "",
    "rocmdoctor.host_removal.RemovalRefused": "",
    "rocmdoctor.provision.server.serve.HostUnresolvable": "give an IP address or a name this host resolves",
    "rocmdoctor.provision.server.lemonade_api.LemonadeError": "",
    "rocmdoctor.provision.fix.FixError": "",
    "rocmdoctor.provision.bundle.selection.PlanError": "",
    "rocmdoctor.provision.bundle.install.InvalidRequest": "",
    "rocmdoctor.provision.bundle.install.InstallError": "",
    "rocmdoctor.provision.tune.search.SloError": "give --slo as METRIC:pPCT<=LIMIT, e.g. ttft:p95<=2s",
    "rocmdoctor.provision.tune.session.SeqsError": "",
    "rocmdoctor.provision.tune.workload.WorkloadError": "",
    "rocmdoctor.provision.tune.writeback.WritebackError": "",
}


def known_error(exc: BaseException) -> str | None:
    """The message and advice for an error the user can act on; None for a bug."""
    for cls in type(exc).__mro__:
        advice = KNOWN_ERRORS.get(f"{cls.__module__}.{cls.__qualname__}")
        if advice is not None:
            text = str(exc) or cls.__name__
            return f"{text}; {advice}" if advice else text
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        advice = " (run as root, or as the owner)" if isinstance(exc, PermissionError) else ""
        return f"{where}{exc.strerror}{advice}"
    return None


class LazyGroup(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException:
            raise
        except Exception as exc:
            message = known_error(exc)
            if message is None:
                raise
            raise UserError(message) from None

    def main(self, *args: Any, **kwargs: Any) -> Any:
        # Every output path of every command (people, --json, errors, a child's log) through the one
        # redactor, fed with the secrets the run learns (key files, keys in the environment, URL userinfo).
        from rocmdoctor.sensitive import redacted_output

        with redacted_output():
            return super().main(*args, **kwargs)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        module = importlib.import_module(f"rocmdoctor.commands.{module_name}")
        command: click.Command = getattr(module, attr)
        if not getattr(command, "_rocmdoctor_globals", False):
            with_global_options(command)
            command._rocmdoctor_globals = True  # type: ignore[attr-defined]
        return command


@dataclass
class App:
    """Global options, handed to every command through click's context object."""

    root: Path = Path("/")
    verbose: int = 0
    no_color: bool = False

    def set_root(self, root: str) -> None:
        if not root.strip():
            raise click.BadParameter("is empty; give a directory or a snapshot archive", param_hint="--root")
        self.root = Path(root)

    def host(self) -> Any:
        from rocmdoctor.host import Host, RootError

        root = self.root
        try:
            if root.is_file():
                from rocmdoctor.snapshot import SnapshotError, unpack

                try:
                    root = unpack(root)
                except SnapshotError as exc:
                    raise UserError(str(exc)) from None
            return Host(root)
        except RootError as exc:
            raise UserError(
                f"{exc}; point --root (or ROCMDOCTOR_ROOT) at a directory or a snapshot archive"
            ) from None
        except OSError as exc:  # a name too long, a component that is no directory, no permission
            raise UserError(
                f"--root {str(root)[:200]}: {exc.strerror or exc}; point it at a directory or a snapshot archive"
            ) from None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rocmdoctor")
@click.option(
    "--root",
    type=str,
    default="/",
    envvar="ROCMDOCTOR_ROOT",
    is_eager=True,
    show_default=True,
    help="Read the host through this directory or `rocmdoctor snapshot` archive. [env var: ROCMDOCTOR_ROOT]",
)
@click.option("-v", "--verbose", count=True, help="Show details under each line (-vv: more).")
@click.option("--no-color", is_flag=True, help="No colour (NO_COLOR is honoured too).")
@click.pass_context
def cli(ctx: click.Context, root: str, verbose: int, no_color: bool) -> None:
    """Diagnose an AMD ROCm host for vLLM, install the vllm-rocm bundle, serve and verify it."""
    app = App(root=Path("/"), verbose=verbose, no_color=no_color)
    app.set_root(root)
    ctx.obj = app


def main() -> None:
    try:
        cli.main(prog_name="rocmdoctor", standalone_mode=True)
    except KeyboardInterrupt:
        click.echo("rocmdoctor: interrupted", err=True)
        sys.exit(130)
    except Exception as exc:
        if os.environ.get("ROCMDOCTOR_DEBUG"):
            raise
        from rocmdoctor.sensitive import redact_exception

        click.echo(
            f"rocmdoctor: internal error: {redact_exception(exc, 2000)}\n"
            "This is a rocmdoctor bug; rerun with ROCMDOCTOR_DEBUG=1 for the traceback and report it.",
            err=True,
        )
        sys.exit(2)
