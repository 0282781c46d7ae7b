"""The versioned JSON report of a diagnosis, and the schema it must satisfy."""

from __future__ import annotations

import json
import math
from typing import Any

from rocmdoctor import __version__
from rocmdoctor.model import Row, Status, envelope, exit_code
from rocmdoctor.policy import verdicts
from rocmdoctor.registry import CheckSpec, Outcome


def check_entry(outcome: Outcome) -> dict[str, Any]:
    """The check's result row, with what the check declares (title, severity, depends) after its id."""
    spec = outcome.spec
    row = Row(spec.id, outcome.result).to_json()
    declared = {"title": spec.title, "severity": spec.severity.value, "depends": list(spec.depends)}
    return {"id": row.pop("id"), **declared, **row}


def summarize(outcomes: list[Outcome]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for outcome in outcomes:
        counts[outcome.result.status.value] += 1
    counts["total"] = len(outcomes)
    return counts


def build_report(root: str, host_facts: dict[str, Any], outcomes: list[Outcome]) -> dict[str, Any]:
    return envelope(
        tool="rocmdoctor",
        version=__version__,
        root=root,
        host=host_facts,
        summary=summarize(outcomes),
        exit_code=exit_code([o.result.status for o in outcomes]),
        policy=verdicts(outcomes),
        checks=[check_entry(o) for o in outcomes],
    )


def list_checks(specs: list[CheckSpec]) -> list[dict[str, Any]]:
    return [
        {
            "id": s.id,
            "title": s.title,
            "severity": s.severity.value,
            "probe": s.probe.value,
            "depends": list(s.depends),
            "reads": list(s.reads),
            "default_enabled": s.default_enabled,
        }
        for s in specs
    ]


def strict(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by null, and a sibling `<key>_null_reason` saying why
    (a JSON parser must never meet `NaN` or `Infinity`: they are not JSON)."""
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(item, float) and not math.isfinite(item):
                out[key] = None
                out.setdefault(f"{key}_null_reason", f"not a finite number ({item!r}): nothing to report")
            else:
                out[key] = strict(item)
        return out
    if isinstance(value, (list, tuple)):
        return [None if isinstance(i, float) and not math.isfinite(i) else strict(i) for i in value]
    return value


def dumps(document: Any) -> str:
    """The one JSON renderer of every command's --json: strict JSON (allow_nan=False after `strict`)."""
    return json.dumps(strict(document), indent=2, sort_keys=False, default=str, allow_nan=False) + "\n"


def load_schema(name: str = "check-report.schema.json") -> dict[str, Any]:
    from importlib import resources  # 7 ms of imports, for the schema only (not on check's path)

    return json.loads(resources.files("rocmdoctor").joinpath("schema", name).read_text(encoding="utf-8"))
