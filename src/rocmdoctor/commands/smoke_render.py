"""Text output for people: smoke steps, one per line."""

from __future__ import annotations

import json
from typing import Any

from rocmdoctor.rendering.check_text import marks_for, print_remedy, status_line


def render_smoke(report: dict[str, Any], console: Any, verbose: int = 0) -> None:
    from rich.text import Text

    marks = marks_for(console)
    console.print(Text(f"rocmdoctor smoke  {report['url']}  model={report['model'] or '?'}", style="bold"))
    for step in report["steps"]:
        status = step["status"]
        line = status_line(marks, status, step["id"], step["summary"], width=12)
        if status != "skip":
            line.append(f"  ({step['elapsed_s'] * 1000:.0f} ms)", style="dim")
        console.print(line)
        if step["remedy"] and status in ("warn", "fail", "error"):
            print_remedy(console, step["remedy"])
        if verbose and step["details"]:
            for detail_line in json.dumps(step["details"], indent=2, default=str).splitlines():
                console.print(Text(f"        {detail_line}", style="dim"))
    summary = report["summary"]
    console.print(
        Text(
            f"{summary['pass']} passed, {summary['warn']} warnings, {summary['fail']} failed, "
            f"{summary['skip']} skipped, {summary['error']} errors",
            style="bold red" if summary["fail"] or summary["error"] else "bold green",
        )
    )
