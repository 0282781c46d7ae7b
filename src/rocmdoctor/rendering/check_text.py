"""Doctor-style text for people: one line per check, the remedy under it, details with -v."""

from __future__ import annotations

import json
from typing import Any

from rocmdoctor.rendering.capacity import render_capacity

MARKS = {"pass": "✓", "warn": "!", "fail": "✗", "skip": "-", "error": "?"}
ASCII_MARKS = {"pass": "ok", "warn": "!!", "fail": "XX", "skip": "--", "error": "??"}
STYLES = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim", "error": "magenta"}


def marks_for(console: Any) -> dict[str, str]:
    encoding = (getattr(console, "encoding", "") or "").lower()
    return MARKS if "utf" in encoding else ASCII_MARKS


def status_line(marks: dict[str, str], status: str, ident: str, summary: str, width: int = 20) -> Any:
    """`[✓] id  summary`: the one line per check (or smoke step) that every report starts from."""
    from rich.text import Text

    line = Text()
    line.append(f"[{marks[status]}] ", style=STYLES[status])
    line.append(f"{ident:<{width}} ", style="bold" if status in ("fail", "error") else "")
    line.append(summary)
    return line


def print_remedy(console: Any, remedy: str) -> None:
    from rich.text import Text

    for remedy_line in remedy.splitlines():
        console.print(Text(f"      → {remedy_line}", style="cyan"))


def render_check_report(report: dict[str, Any], console: Any, verbose: int = 0) -> None:
    from rich.text import Text

    marks = marks_for(console)
    host = report.get("host", {})
    distro = host.get("distro") or {}
    gpus = host.get("gpus") or []
    header = f"rocmdoctor {report['version']}  root={report['root']}  kernel={host.get('kernel') or '?'}"
    header += f"  distro={distro.get('id') or '?'} {distro.get('version') or ''}".rstrip()
    console.print(Text(header, style="bold"))
    for gpu in gpus:
        kind = "APU" if gpu.get("apu") else "dGPU"
        console.print(
            Text(
                f"  GPU node {gpu['node']}: {gpu['gfx']} ({kind}), bundle family {gpu.get('family') or 'none'}"
            )
        )
    console.print()
    for entry in report["checks"]:
        status = entry["status"]
        console.print(status_line(marks, status, entry["id"], entry["summary"]))
        if entry.get("remedy") and status in ("warn", "fail", "error"):
            print_remedy(console, entry["remedy"])
        if verbose and entry.get("details"):
            details = {k: v for k, v in entry["details"].items() if verbose > 1 or k != "traceback"}
            for remedy_line in json.dumps(details, indent=2, default=str).splitlines():
                console.print(Text(f"        {remedy_line}", style="dim"))
    render_capacity(report.get("capacity"), console)
    summary = report["summary"]
    console.print()
    console.print(
        Text(
            f"{summary['pass']} passed, {summary['warn']} warnings, {summary['fail']} failed, "
            f"{summary['skip']} skipped, {summary['error']} errors",
            style="bold red" if summary["fail"] else "bold",
        )
    )
