"""`rocmdoctor explain` for people: each cause with its evidence lines, what the host says, the remedy."""

from __future__ import annotations

from typing import Any

from rocmdoctor.vllm.log_signatures import printable

VERDICT_WORDS = {
    "confirmed": "confirmed",
    "ruled_out": "ruled out",
    "cannot_tell": "cannot tell",
    "no_check": "no host check",
}


def _where(line: dict[str, Any]) -> str:
    at = f"line {line['line']}" if line["line"] is not None else f"byte {line['offset']}"
    return f"{printable(line['log'])} {at}"


def _source(source: dict[str, Any]) -> str:
    text = f"{printable(source['name'])}: {source['lines']} lines, {source['bytes_read']} bytes read"
    notes = [source["cut"]] if source["cut"] else []
    if source["binary"]:
        notes.append("binary data (NUL bytes) in it")
    if source["overlong_lines"]:
        notes.append(f"{source['overlong_lines']} overlong lines looked at in part")
    return text + (f" ({'; '.join(notes)})" if notes else "")


def render(report: dict[str, Any], verbose: int = 0) -> str:
    out = [_source(s) for s in report["sources"]]
    out.append("")
    for n, cause in enumerate(report["causes"], 1):
        out.append(f"{n}. {cause['id']}: {cause['summary']}")
        more = cause["matches"] - len(cause["evidence"])
        for line in cause["evidence"]:
            out.append(f"     {_where(line)}: {line['text']}")
        if more > 0:
            out.append(f"     ... and {more} more matching lines")
        host = cause["host"]
        out.append(f"   host: {VERDICT_WORDS[host['verdict']]}: {host['says']}")
        out.append(f"   remedy: {cause['remedy']}")
        if verbose:
            out.append(f"   source: {cause['source']}")
        out.append("")
    if report["unexplained"]:
        out.append("No known cause. The lines that looked most like an error:")
        out += [f"     {_where(line)}: {line['text']}" for line in report["unexplained"]]
        out.append("")
    elif not report["causes"]:
        out.append("Nothing wrong found: no known cause and no error lines.")
        out.append("")
    return "\n".join(out)
