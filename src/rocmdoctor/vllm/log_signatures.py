"""The known causes of a failed vLLM/ROCm start, recognised in log lines: vllm/data/log_signatures.json.

A pattern is matched at the start of a line's message, after the prefixes loggers put before it
(timestamps, the journal's host and unit, dmesg's clock, vLLM's process tag and level, lemond's level
and component) are taken off: "hipErrorInvalidImage" inside a sentence that merely mentions it is not
the error itself. `serve`'s wait and `rocmdoctor explain` read the same table.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

# One line is kept up to MAX_LINE_CHARS and matched on its first MATCH_CHARS: the start of a message
# carries the cause (loggers' prefixes take ~150 characters, the longest pattern ~350 after them), and a
# long line (a binary file, a dumped tensor, a hostile one) must not make a regex walk it.
MAX_LINE_CHARS = 4096
MATCH_CHARS = 1024

# Terminal sequences a log may carry: CSI (colours) and OSC (titles, links), ended by BEL or ST.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]{0,512}(?:\x07|\x1b\\)")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
# Each strips one prefix; they are tried again until none applies, since loggers nest (a journal line
# carrying lemond's line carrying vLLM's line).
_PREFIX_FORMS = (
    # journalctl's short and short-iso forms: "Aug 08 22:35:13 host ident[pid]: "
    r"^[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ [^\s:\[]+(?:\[\d+\])?: ",
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)? \S+ [^\s:\[]+(?:\[\d+\])?: ",
    # dmesg: "[ 12.345678] ", dmesg -T: "[Tue Dec  9 17:04:31 2025] "
    r"^\[\s*\d+\.\d+\] ",
    r"^\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}\] ",
    # a bare timestamp (lemond, CI logs, docker --timestamps), bracketed or not
    r"^\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?,?\s+",
    # vLLM's process tag: "(EngineCore_DP0 pid=742) ", "(VllmWorker rank=0 pid=1) ", Ray's replicas
    r"^\([^()]*\bpid=\d+[^()]*\) ",
    r"^\((?:APIServer|EngineCore\w*|VllmWorker\w*|Worker\w*|RayWorkerWrapper)\) ",
    r"^\[rank\d+\]:\s*",
    # vLLM's level/date/file: "ERROR 06-16 20:55:14 [core.py:1224] ", older "INFO 11-15 19:35:53 api_server.py:564] "
    r"^(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)(?: \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?)?"
    r"(?: \[[^\]]*\]| [\w./-]+:\d+\])?:?\s+",
    # lemond: "[Error] (Router) ", its wrapped process output "[Info] (Process) "
    r"^\[(?:Error|Warn|Warning|Info|Debug|Trace|Critical)\] \([^)]*\) ",
    # docker compose: "vllm-1  | "
    r"^[A-Za-z][\w.-]*\s+\| ",
)
# One alternation: a line costs one regex call per prefix it has, not one per form.
_PREFIX = re.compile("|".join(f"(?:{form})" for form in _PREFIX_FORMS))


def printable(text: str) -> str:
    """A line fit to show on a terminal: colour codes dropped, other control characters (a hostile log's
    escape sequences, a binary file's bytes) as U+FFFD, so a log cannot drive the reader's terminal."""
    return _CONTROL.sub("\ufffd", _ANSI.sub("", text))


def message(line: str) -> str:
    """The message of a log line: colour codes, surrounding space and loggers' prefixes taken off."""
    text = line[:MATCH_CHARS]
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    text = text.strip()
    for _ in range(12):  # nesting is shallow; a bound keeps a crafted line from looping long
        found = _PREFIX.match(text)
        if found is None or not found.end():
            break
        text = text[found.end() :].lstrip()
    return text


@dataclass(frozen=True, slots=True)
class Signature:
    id: str
    summary: str
    remedy: str
    checks: tuple[str, ...]
    host_problem: bool
    patterns: tuple[re.Pattern[str], ...]
    source: str
    example: str

    def remedy_for(self, match: re.Match[str]) -> str:
        """The remedy with the match's named groups filled in (max-model-len's length that fits)."""
        groups = {k: v for k, v in match.groupdict().items() if v is not None}
        try:
            return self.remedy.format(**groups)
        except (KeyError, IndexError):
            return self.remedy


class TableError(ValueError):
    """The shipped table is malformed: a bug of rocmdoctor's, caught by its tests."""


def _signature(entry: Any) -> Signature:
    if not isinstance(entry, dict):
        raise TableError(f"a signature is not an object: {entry!r}")
    try:
        return Signature(
            id=str(entry["id"]),
            summary=str(entry["summary"]),
            remedy=str(entry["remedy"]),
            checks=tuple(str(c) for c in entry.get("checks", ())),
            host_problem=bool(entry.get("host_problem", True)),
            patterns=tuple(re.compile(p) for p in entry["patterns"]),
            source=str(entry["source"]),
            example=str(entry["example"]),
        )
    except (KeyError, TypeError, re.error) as exc:
        raise TableError(f"signature {entry.get('id')!r}: {exc}") from exc


@lru_cache(maxsize=1)
def signatures() -> tuple[Signature, ...]:
    """The table, in priority order (a root cause before what it leads to)."""
    text = resources.files("rocmdoctor.vllm").joinpath("data", "log_signatures.json").read_text()
    table = tuple(_signature(e) for e in json.loads(text)["signatures"])
    ids = [s.id for s in table]
    if len(ids) != len(set(ids)):
        raise TableError(f"duplicate signature ids in {ids}")
    return table


@lru_cache(maxsize=1)
def _combined() -> tuple[re.Pattern[str], dict[str, tuple[int, int]]]:
    """Every pattern in one alternation, so a line that matches none (most lines) costs one regex call;
    each branch is named so the matching signature and pattern are known without trying them all."""
    branches: list[str] = []
    where: dict[str, tuple[int, int]] = {}
    for i, sig in enumerate(signatures()):
        for j, pattern in enumerate(sig.patterns):
            name = f"s{i}_{j}"
            where[name] = (i, j)
            # The pattern's own named groups would clash across branches: drop their names here; the
            # signature's own pattern is matched again for its groups.
            plain = re.sub(r"\(\?P<\w+>", "(?:", pattern.pattern)
            branches.append(f"(?P<{name}>{plain})")
    return re.compile("|".join(branches)), where


@dataclass(frozen=True, slots=True)
class LineMatch:
    signature: Signature
    match: re.Match[str]
    message: str


def match_line(line: str) -> LineMatch | None:
    """The highest-priority signature whose pattern starts this line's message, if any."""
    return match_message(message(line))


def match_message(text: str) -> LineMatch | None:
    """`match_line` for a message already taken out of its line."""
    if not text:
        return None
    combined, where = _combined()
    found = combined.match(text)
    if found is None:
        return None
    # The alternation takes the first branch that matches at position 0; a later signature's pattern
    # can win only where an earlier one does not match, which is the priority we want anyway.
    assert found.lastgroup is not None
    i, j = where[found.lastgroup]
    sig = signatures()[i]
    own = sig.patterns[j].match(text)
    assert own is not None
    return LineMatch(sig, own, text)
