"""The versioned JSON report of a diagnosis, and the schema it must satisfy."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from . import __version__
from .model import SCHEMA_VERSION, Status, exit_code
from .policy import verdicts
from .registry import CheckSpec, Outcome


def check_entry(outcome: Outcome) -> dict[str, Any]:
    spec, result = outcome.spec, outcome.result
    return {
        "id": spec.id,
        "title": spec.title,
        "severity": spec.severity.value,
        "depends": list(spec.depends),
        "status": result.status.value,
        "summary": result.summary,
        "remedy": result.remedy,
        "details": result.details,
    }


def summarize(outcomes: list[Outcome]) -> dict[str, int]:
    counts = {s.value: 0 for s in Status}
    for outcome in outcomes:
        counts[outcome.result.status.value] += 1
    counts["total"] = len(outcomes)
    return counts


def build_report(root: str, host_facts: dict[str, Any], outcomes: list[Outcome]) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": "rocmdoctor",
        "version": __version__,
        "root": root,
        "host": host_facts,
        "summary": summarize(outcomes),
        "exit_code": exit_code([o.result.status for o in outcomes]),
        "policy": verdicts(outcomes),
        "checks": [check_entry(o) for o in outcomes],
    }


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


def dumps(document: Any) -> str:
    return json.dumps(document, indent=2, sort_keys=False, default=str) + "\n"


def load_schema(name: str = "check-report.schema.json") -> dict[str, Any]:
    return json.loads(resources.files("rocmdoctor").joinpath("schema", name).read_text(encoding="utf-8"))
