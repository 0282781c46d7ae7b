"""`explain`'s report: the causes over all logs in priority order, each judged on the host, the unexplained
error lines when there is no cause, and the exit code; data for the JSON envelope and the rendering."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rocmdoctor.commands.common import App
    from rocmdoctor.commands.explain_input import SourceScan


def build_report(app: App, scans: list[SourceScan], port: int) -> dict[str, Any]:
    from rocmdoctor.model import envelope

    causes = causes_of(scans)
    judge(app, causes, port)
    unexplained = [] if causes else [_line(s.name, line) for s in scans for line in s.scan.error_like()]
    return envelope(
        root=str(app.root),
        sources=[source_json(s) for s in scans],
        causes=causes,
        unexplained=unexplained,
        exit_code=1 if causes or unexplained else 0,
    )


def causes_of(scans: list[SourceScan]) -> list[dict[str, Any]]:
    """One entry per cause over all logs, in the table's priority order, with its evidence lines."""
    from rocmdoctor.sensitive import redact_message
    from rocmdoctor.vllm.log_signatures import signatures

    found: dict[str, dict[str, Any]] = {}
    for source in scans:
        for cause_id, ev in source.scan.evidence.items():
            sig = ev.signature
            entry = found.setdefault(
                cause_id,
                {
                    "id": cause_id,
                    "summary": sig.summary,
                    "remedy": redact_message(sig.remedy_for(ev.first.match)),
                    "host_problem": sig.host_problem,
                    "source": sig.source,
                    "checks": list(sig.checks),
                    "matches": 0,
                    "evidence": [],
                },
            )
            entry["matches"] += ev.count
            entry["evidence"] += [_line(source.name, line) for line in ev.lines]
    rank = {s.id: i for i, s in enumerate(signatures())}
    return sorted(found.values(), key=lambda c: rank[c["id"]])


def _line(log: str, line: Any) -> dict[str, Any]:
    from rocmdoctor.sensitive import redact_message

    return {"log": log, "line": line.number, "offset": line.offset, "text": redact_message(line.text)}


def judge(app: App, causes: list[dict[str, Any]], port: int) -> None:
    """Each cause's checks run on this host (or --root); ruled-out causes move after the others."""
    from rocmdoctor.commands.check_context import check_context
    from rocmdoctor.commands.explain_host import RULED_OUT, run_checks, verdict
    from rocmdoctor.registry import DEFAULT_PREFIX

    wanted = {c for cause in causes if cause["host_problem"] for c in cause["checks"]}
    outcomes = run_checks(check_context(app, None, port, DEFAULT_PREFIX), wanted) if wanted else {}
    for cause in causes:
        cause["host"] = verdict(tuple(cause["checks"]), cause["host_problem"], outcomes).to_json()
    causes.sort(key=lambda c: c["host"]["verdict"] == RULED_OUT)


def source_json(source: SourceScan) -> dict[str, Any]:
    scan = source.scan
    return {
        "name": source.name,
        "kind": source.kind,
        "bytes_read": scan.bytes_read,
        "lines": scan.lines,
        "cut": source.cut or None,
        "skipped": [{"offset": offset, "bytes": size} for offset, size in scan.skipped],
        "overlong_lines": scan.overlong_lines,
        "binary": scan.binary_bytes > 0,
    }
