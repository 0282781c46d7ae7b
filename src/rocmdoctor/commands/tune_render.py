"""`rocmdoctor tune` for people: the measured points as a table, the winner, the write-back; the plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rocmdoctor.model import Change
from rocmdoctor.rendering.change_text import change_text


def _ms(latency: dict[str, dict[str, float]], metric: str, key: str) -> str:
    value = (latency.get(metric) or {}).get(key)
    return "-" if value is None else f"{value:.1f}"


def render_tune(report: dict[str, Any], document: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    slo = report["slo"]
    limit = f"{slo['metric']} p{slo['percentile']} <= {slo['limit_ms']:g} ms" if slo else "none (the knee)"
    table = Table(
        title=f"rocmdoctor tune  {report['plan']['workload']['source']} workload, limit: {limit}\n"
        f"{report['server_starts']} server starts, {report['known_points_used']} known points, "
        f"{report['seconds']:.0f} s",
        title_justify="left",
        box=None,
    )
    for header in ("seqs", "batched", "tok/s", "fail", "TTFT p50/p95", "ITL p50/p95", "E2EL p50/p95", "from"):
        table.add_column(header, justify="right", no_wrap=True)
    winner = report["winner"] or {}
    key = (winner.get("max_num_seqs"), winner.get("max_num_batched_tokens"))
    for point in sorted(
        report["points"], key=lambda p: (p["max_num_batched_tokens"] or 0, p["max_num_seqs"])
    ):
        lat = point["latency_ms"]
        mark = (point["max_num_seqs"], point["max_num_batched_tokens"]) == key
        table.add_row(
            str(point["max_num_seqs"]),
            str(point["max_num_batched_tokens"] or "default"),
            f"{point['output_tokens_per_s']:.1f}" if not point["error"] else "error",
            str(point["failures"]),
            f"{_ms(lat, 'ttft', 'p50')}/{_ms(lat, 'ttft', 'p95')}",
            f"{_ms(lat, 'itl', 'p50')}/{_ms(lat, 'itl', 'p95')}",
            f"{_ms(lat, 'e2el', 'p50')}/{_ms(lat, 'e2el', 'p95')}",
            point["source"],
            style="bold green" if mark else "",
        )
    console.print(table)
    for point in report["points"]:
        if point["error"]:
            console.print(f"  max-num-seqs {point['max_num_seqs']}: {point['error']}", markup=False)
    if report["winner"]:
        flags = f"--max-num-seqs {winner['max_num_seqs']}"
        if winner["max_num_batched_tokens"]:
            flags += f" --max-num-batched-tokens {winner['max_num_batched_tokens']}"
        console.print(
            f"winner: {flags} ({winner['output_tokens_per_s']:.1f} output tokens/s): {report['reason']}",
            markup=False,
        )
    else:
        best = report["best_seen"]
        seen = (
            f"; best seen: max-num-seqs {best['max_num_seqs']}, {best['output_tokens_per_s']:.1f} tokens/s"
            if best
            else ""
        )
        console.print(f"NO WINNER: {report['reason']}{seen}", markup=False)
    # the one rendering of a Change: the write-back's diff, its message, changed=
    change = Change(document["changed"], document["msg"], document.get("diff") or "")
    console.print(change_text(change), markup=False, highlight=False)


def write_plot(report: dict[str, Any], path: Path) -> None:
    from rocmdoctor.commands.bench_plot import require_matplotlib

    plt = require_matplotlib()
    base = sorted(
        (p for p in report["points"] if not p["error"]),
        key=lambda p: (p["max_num_batched_tokens"] or 0, p["max_num_seqs"]),
    )
    figure, (throughput_ax, latency_ax) = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    for batched in sorted({p["max_num_batched_tokens"] or 0 for p in base}):
        series = [p for p in base if (p["max_num_batched_tokens"] or 0) == batched]
        seqs = [p["max_num_seqs"] for p in series]
        label = f"batched tokens {batched or 'default'}"
        throughput_ax.plot(seqs, [p["output_tokens_per_s"] for p in series], marker="o", label=label)
        for metric in ("ttft", "itl", "e2el"):
            latency_ax.plot(
                seqs,
                [(p["latency_ms"].get(metric) or {}).get("p95") for p in series],
                marker="o",
                label=f"{metric} p95, {label}",
            )
    winner = report["winner"]
    if winner:
        for ax in (throughput_ax, latency_ax):
            ax.axvline(winner["max_num_seqs"], color="grey", linestyle="--", linewidth=1)
    slo = report["slo"]
    if slo:
        latency_ax.axhline(slo["limit_ms"], color="red", linestyle=":", linewidth=1, label="limit")
    throughput_ax.set_ylabel("output tokens/s")
    throughput_ax.set_title("rocmdoctor tune: throughput and latency against max-num-seqs")
    latency_ax.set_yscale("log")
    latency_ax.set_ylabel("latency p95 (ms, log scale)")
    latency_ax.set_xlabel("max-num-seqs")
    for ax in (throughput_ax, latency_ax):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
