"""`rocmdoctor bench`: measure what concurrency buys, and where the knee is."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rocmdoctor import params
from rocmdoctor.commands.common import App, UserError, emit_json, pass_app
from rocmdoctor.commands.smoke_options import (
    _all_instances,
    _api_key,
    _common_options,
    _concurrency,
    _plot_path,
    _url,
    refuse_with_all_instances,
)

if TYPE_CHECKING:
    from rocmdoctor.provision.verify.bench import BenchOptions

# Every prompt is built before the first request: --requests x --prompt-tokens is bounded, whichever
# of the two click reads second checks the product.
PROMPT_TOKENS_LIMIT = params.product_limit(("requests", "prompt_tokens"), 1 << 24, "prompt tokens")


@click.command()
@_common_options
@_all_instances
@click.option(
    "--concurrency",
    "concurrency_list",
    type=params.CountList(1, 1024),
    default="1,2,4,8,16",
    show_default=True,
    help="Concurrency levels, comma-separated; 1 (sequential) is always run.",
)
@click.option(
    "--requests",
    type=params.Count(1, 100_000),
    callback=PROMPT_TOKENS_LIMIT,
    default=32,
    show_default=True,
    help="Requests sent at every level (at least the largest concurrency).",
)
@click.option(
    "--prompt-tokens",
    type=params.Count(1, 1 << 20),
    callback=PROMPT_TOKENS_LIMIT,
    default=128,
    show_default=True,
    help="Prompt length in tokens (exact where the server has /tokenize, as vLLM does).",
)
@click.option(
    "--max-tokens",
    type=params.Count(2, 1 << 20),
    default=128,
    show_default=True,
    help="Output tokens per request (sent with ignore_eos, so every answer has this length).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the versioned JSON report on stdout.")
@click.option(
    "--plot",
    "plot",
    type=params.NonEmptyPath(path_type=Path, dir_okay=False),
    default=None,
    help="Write throughput and latency against concurrency to FILE.png or FILE.svg.",
)
@click.option(
    "--record",
    type=params.NonEmptyPath(path_type=Path, dir_okay=False),
    default=None,
    help="Also write the JSON report to FILE (atomically): the baseline `rocmdoctor upgrade` compares "
    "a new bundle with (<prefix>/bench-baseline.<unit>.json).",
)
@pass_app
def bench(
    app: App,
    url: str,
    model: str,
    api_key_file: Path | None,
    timeout_s: float | None,
    all_instances: bool,
    concurrency_list: str,
    requests: int,
    prompt_tokens: int,
    max_tokens: int,
    as_json: bool,
    plot: Path | None,
    record: Path | None,
) -> None:
    """Measure what concurrency buys: tokens/s, speedup, TTFT/TPOT/ITL/E2EL, and the knee.

    With --all-instances: each written instance alone, then all at once, at the highest --concurrency
    level; the aggregate against the sum of the single-instance figures.

    Exit 0: every request succeeded and the token count matches the server's; 1: failures or a
    mismatch; 2: bad input or nothing answers.
    """
    from rocmdoctor.provision.verify.bench import BenchOptions

    levels = _concurrency(concurrency_list)
    if requests < max(levels):
        raise UserError(
            f"--requests {requests} is smaller than the largest --concurrency {max(levels)}: "
            "every level sends the same requests, so send at least that many"
        )
    if all_instances:
        from rocmdoctor.commands.instances_setup import bench_instances
        from rocmdoctor.host_writes import HostWriter

        refuse_with_all_instances("url", "model", "api_key_file", "timeout_s", "prompt_tokens", "plot")
        bench_instances(HostWriter(app.root), None, as_json, max(levels), requests, max_tokens)
    options = BenchOptions(
        _url(url),
        model,
        _api_key(api_key_file),
        timeout_s or 60.0,
        levels,
        requests,
        prompt_tokens,
        max_tokens,
    )
    plot_path = _plot_path(plot)
    report = _measure(options)
    if record is not None:
        _record(report, record)
    _emit(app, report, as_json, plot_path)


def _measure(options: BenchOptions) -> dict[str, Any]:
    """The bench report; a server that cannot be reached is exit 2, a run it stopped is exit 1."""
    from rocmdoctor.provision.verify import openai_client as oc
    from rocmdoctor.provision.verify.bench import BenchAborted, abort_remedy, run_bench

    try:
        return run_bench(options)
    except BenchAborted as exc:
        remedy = abort_remedy(exc.error, options.api_key is not None)
        if exc.error.kind == oc.UNREACHABLE:
            raise UserError(
                f"{exc.error}; start the server (`rocmdoctor serve`) or point --url at it"
            ) from None
        click.echo(f"rocmdoctor: bench stopped: {exc.error}\n  → {remedy}", err=True)
        sys.exit(1)


def _record(report: dict[str, Any], record: Path) -> None:
    """--record: the report as the baseline `upgrade` compares with, written through the Target."""
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.report import dumps

    try:
        HostWriter("/").write_text_file(record, dumps(report))
    except OSError as exc:
        raise UserError(
            f"--record {record}: {exc.strerror or exc}; name a file in a writable folder"
        ) from None


def _emit(app: App, report: dict[str, Any], as_json: bool, plot_path: Path | None) -> None:
    """The plot if asked, the JSON or the text report, and the report's exit code."""
    if plot_path is not None:
        from rocmdoctor.commands.bench_plot import write_plot

        write_plot(report, plot_path)
    if as_json:
        emit_json(report)
    else:
        from rocmdoctor.commands.bench_render import render_bench
        from rocmdoctor.rendering.console import make_console

        render_bench(report, make_console(no_color=app.no_color), plot_path)
    sys.exit(report["exit_code"])
