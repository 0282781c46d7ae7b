"""The fleet dashboard drawn with matplotlib from a real Prometheus: each panel's own PromQL
(playbooks/roles/rocmdoctor/files/grafana/rocmdoctor-fleet.json) run with query_range, one subplot
per panel. Grafana does not install here; the queries and data are the same."""

from __future__ import annotations

import json
from pathlib import Path

from harness.prometheus_stack import Prometheus
from harness.promql import DASHBOARD

PROBE_ROWS = 5  # at most one row per verdict


def _legend(template: str, labels: dict[str, str]) -> str:
    out = template
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out


def plot(prom: Prometheus, start: float, end: float, out: Path, step: float = 1.0) -> dict[str, int]:
    """Draw every panel of the dashboard over [start, end]; returns panel title -> series drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = json.loads(DASHBOARD.read_text())["panels"]
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.2 * rows), squeeze=False)
    drawn: dict[str, int] = {}
    for ax, panel in zip(axes.flat, panels, strict=False):
        count = 0
        timeline = panel["type"] == "state-timeline"  # one row per series, marked where it holds
        for target in panel["targets"]:
            expr = target["expr"].replace("$host", ".*")
            for series in prom.query_range(expr, start, end, step):
                xs = [float(t) - start for t, _ in series["values"]]
                ys = [float(v) * (count + 1 if timeline else 1) for _, v in series["values"]]
                label = _legend(target["legendFormat"], series["metric"])[:60]
                if timeline:
                    ax.plot(xs, ys, "s", markersize=4, label=label)
                    ax.set_ylim(0, PROBE_ROWS + 1)
                else:
                    ax.plot(xs, ys, drawstyle="steps-post", label=label)
                count += 1
        drawn[panel["title"]] = count
        ax.set_title(panel["title"], fontsize=10)
        ax.set_xlabel("seconds", fontsize=8)
        ax.tick_params(labelsize=7)
        if count:
            ax.legend(fontsize=6, loc="upper left")
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(
        "rocmdoctor fleet dashboard: the panels' PromQL against the system test's Prometheus", fontsize=11
    )
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return drawn
