"""Result rows for people (model.Row): a line per row, its remedy under it. The one text layout of
Lemonade's findings, the cluster pre-flight's and the managed servers' health."""

from __future__ import annotations

from collections.abc import Iterable

from rocmdoctor.model import Row


def row_lines(rows: Iterable[Row]) -> list[str]:
    lines = []
    for row in rows:
        about = f"{row.subject}: " if row.subject else ""
        lines.append(f"{row.status.value.upper():5} {about}{row.id}: {row.result.summary}")
        if row.result.remedy:
            lines.append(f"      -> {row.result.remedy}")
    return lines
