"""Text output for people: the bench as a table with its verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rocmdoctor.provision.verify.bench import COUNTER


def _ms(distribution: dict[str, float] | None, *keys: str) -> str:
    return "-" if not distribution else "/".join(f"{distribution[key]:.1f}" for key in keys)


def render_bench(report: dict[str, Any], console: Any, plot_path: Path | None = None) -> None:
    from rich.table import Table
    from rich.text import Text

    settings = report["settings"]
    table = Table(
        title=f"rocmdoctor bench  {report['url']}  model={report['model']}\n"
        f"{settings['requests']} requests x {settings['prompt_tokens']} in / "
        f"{settings['max_tokens']} out tokens",
        title_justify="left",
        box=None,
    )
    for header in (
        "conc",
        "fail",
        "tok/s",
        "req/s",
        "speedup",
        "TTFT p50/p99",
        "TPOT p50",
        "ITL p50/p99",
        "E2EL p50/p99",
    ):
        table.add_column(header, justify="right", no_wrap=True)
    knee = report["knee"] or {}
    for level in report["levels"]:
        row_style = "bold" if level["concurrency"] == knee.get("concurrency") else ""
        table.add_row(
            str(level["concurrency"]),
            str(level["failures"]),
            f"{level['output_tokens_per_s']:.1f}",
            f"{level['requests_per_s']:.2f}",
            "-" if level["speedup"] is None else f"{level['speedup']:.2f}x",
            _ms(level["ttft_ms"], "p50", "p99"),
            _ms(level["tpot_ms"], "p50"),
            _ms(level["itl_ms"], "p50", "p99"),
            _ms(level["e2el_ms"], "p50", "p99"),
            style=row_style,
        )
    if not console.is_terminal:
        console.width = max(console.width, 120)  # a pipe or file has no width; keep the numbers whole
    console.print(table)
    console.print(
        Text(
            "latencies in ms (ms/ms: p50/p99); TTFT, TPOT, ITL and E2EL as `vllm bench serve` defines them",
            style="dim",
        )
    )
    if knee:
        console.print(
            Text(
                f"knee: concurrency {knee['concurrency']} ({knee['output_tokens_per_s']:.1f} tok/s); "
                f"{knee['advice']}",
                style="bold",
            )
        )
    for level in report["levels"]:
        for error in level["errors"]:
            console.print(Text(f"concurrency {level['concurrency']}: {error}", style="red"))
    check = report["cross_check"]
    check_style = {"match": "green", "mismatch": "bold red"}.get(check["status"], "yellow")
    console.print(
        Text(
            f"token cross-check: {check['status']}: counted {check['counted_tokens']}, server "
            f"{COUNTER} grew by {check['server_tokens'] if check['server_tokens'] is not None else '?'}"
            + (f" ({check['detail']})" if check["detail"] else ""),
            style=check_style,
        )
    )
    prefix = report.get("prefix_cache")
    if prefix and prefix["hits"]:
        console.print(
            Text(
                f"prefix cache: {prefix['hits']} of {prefix['queries']} prompt tokens served from the "
                f"server's cache ({prefix['detail']})",
                style="yellow",
            )
        )
    if report["aborted"]:
        aborted = report["aborted"]
        console.print(
            Text(
                f"aborted at concurrency {aborted['at_concurrency']}: {aborted['message']}", style="bold red"
            )
        )
        console.print(Text(f"      → {aborted['remedy']}", style="cyan"))
    if plot_path is not None:
        console.print(Text(f"plot written to {plot_path}"))
