"""The options `smoke`, `bench`, `tune` and `upgrade` share about a running server: its URL, its key,
the concurrency list, a plot's path, `--all-instances`. Not a command: commands import it, so no
command imports another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from rocmdoctor import params
from rocmdoctor.commands.common import UserError

PLOT_SUFFIXES = (".png", ".svg")


def _url(value: str) -> str:
    from rocmdoctor.provision.verify.openai_client import normalize_url

    try:
        return normalize_url(value)
    except ValueError as exc:
        raise UserError(f"--url: {exc}") from None


def _api_key(path: Path | None) -> str | None:
    """The key in the file (the one reader: regular file, bounded, one key); never on the command line."""
    if path is None:
        return None
    from rocmdoctor.sensitive import KeyFileError, read_api_key

    try:
        return read_api_key(path)
    except KeyFileError as exc:
        raise UserError(f"{exc}; write the key vLLM was started with into it") from None


def _concurrency(value: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in value.split(","))
    except ValueError:
        levels = ()
    if not levels or any(level < 1 for level in levels):
        raise UserError(
            f"--concurrency {value!r}: give positive whole numbers separated by commas, e.g. 1,2,4,8,16"
        )
    return tuple(sorted(set(levels)))


def _plot_path(path: Path | None) -> Path | None:
    if path is None:
        return None
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise UserError(f"--plot {path}: name a .png or .svg file")
    if not path.parent.is_dir():
        raise UserError(f"--plot {path}: the folder {path.parent} does not exist")
    from rocmdoctor.commands.bench_plot import PlotUnavailable, require_matplotlib

    try:
        require_matplotlib()
    except PlotUnavailable as exc:
        raise UserError(str(exc)) from None
    return path


def refuse_with_all_instances(*names: str) -> None:
    """--all-instances takes each server's address and key from the written instance files: options
    that name one server would be silently ignored, so they are an error."""
    ctx = click.get_current_context()
    by_name = {p.name: p for p in ctx.command.params}
    given = [by_name[n].opts[0] for n in names if ctx.get_parameter_source(n) is ParameterSource.COMMANDLINE]
    if given:
        flags = ", ".join(given)
        raise UserError(
            f"{flags}: not with --all-instances, which reaches every instance `rocmdoctor instances --write` "
            "wrote, at its own port and with its own key"
        )


def _all_instances(fn: Any) -> Any:
    return click.option(
        "--all-instances",
        is_flag=True,
        help="Test every server `rocmdoctor instances --write` wrote (its port and key from its files).",
    )(fn)


def _common_options(fn: Any) -> Any:
    fn = click.option(
        "--timeout",
        "timeout_s",
        type=params.Duration(max_s=24 * 3600),
        default=None,
        help="Seconds of silence from the server before a request fails (smoke: 30, bench: 60).",
    )(fn)
    fn = click.option(
        "--api-key-file",
        type=params.NonEmptyPath(path_type=Path, dir_okay=False),
        callback=params.key_file(),
        default=None,
        help="File holding the server's API key (vLLM --api-key).",
    )(fn)
    fn = click.option(
        "--model",
        default="auto",
        show_default=True,
        help="Served model name; auto takes the first one /v1/models lists.",
    )(fn)
    fn = click.option(
        "--url",
        type=params.ServerUrl(),
        default="http://127.0.0.1:8000",
        show_default=True,
        envvar="ROCMDOCTOR_URL",
        help="The vLLM server. [env var: ROCMDOCTOR_URL]",
    )(fn)
    return fn
