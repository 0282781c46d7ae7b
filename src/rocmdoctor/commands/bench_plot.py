"""The bench plot: throughput and latency against concurrency, to PNG or SVG (matplotlib, extra `plot`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class PlotUnavailable(Exception):
    pass


def require_matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(
            "--plot needs matplotlib: pip install 'rocmdoctor[plot]' (or leave out --plot)"
        ) from None
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _series(levels: list[dict[str, Any]], metric: str, key: str) -> list[float | None]:
    return [lv[metric][key] if lv[metric] else None for lv in levels]


def write_plot(report: dict[str, Any], path: Path) -> None:
    plt = require_matplotlib()
    levels = report["levels"]
    concurrency = [lv["concurrency"] for lv in levels]
    figure, (throughput_ax, latency_ax) = plt.subplots(2, 1, figsize=(8, 8), sharex=True)
    throughput_ax.plot(concurrency, [lv["output_tokens_per_s"] for lv in levels], marker="o")
    for level in levels:
        if level["speedup"] is not None:
            throughput_ax.annotate(
                f"{level['speedup']:.2f}x",
                (level["concurrency"], level["output_tokens_per_s"]),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=8,
            )
    knee = report["knee"]
    if knee:
        latency_ax.axvline(knee["concurrency"], color="grey", linestyle="--", linewidth=1)
        throughput_ax.axvline(
            knee["concurrency"],
            color="grey",
            linestyle="--",
            linewidth=1,
            label=f"knee: concurrency {knee['concurrency']}",
        )
        throughput_ax.legend()
    throughput_ax.set_ylabel("output tokens/s")
    throughput_ax.set_title(f"rocmdoctor bench: {report['model']} at {report['url']}")
    for metric, label in (
        ("ttft_ms", "TTFT p50"),
        ("tpot_ms", "TPOT p50"),
        ("itl_ms", "ITL p99"),
        ("e2el_ms", "E2EL p50"),
    ):
        key = "p99" if label.endswith("p99") else "p50"
        latency_ax.plot(concurrency, _series(levels, metric, key), marker="o", label=label)
    latency_ax.set_yscale("log")
    latency_ax.set_ylabel("latency (ms, log scale)")
    latency_ax.set_xlabel("concurrent requests")
    latency_ax.set_xscale("log", base=2)
    latency_ax.set_xticks(concurrency, [str(c) for c in concurrency])
    latency_ax.legend()
    for ax in (throughput_ax, latency_ax):
        ax.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
