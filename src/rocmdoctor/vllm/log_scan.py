"""A log read within fixed memory: bytes in, per-signature evidence and the most error-like lines out.

The scanner keeps no more than a few lines per cause and a few candidate error lines, whatever the
size of the log; a line is looked at up to `log_signatures.MAX_LINE_CHARS` and the rest of an overlong
line (binary data without newlines) is counted but never held. What is read, and what is skipped, is
the caller's choice (`commands/explain_input.py`); it tells the scanner with `skip()`, after which line
numbers are unknown (counting them would mean reading what was skipped) and byte offsets stand in.
"""

from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field

from rocmdoctor.vllm.log_signatures import (
    MAX_LINE_CHARS,
    LineMatch,
    Signature,
    match_message,
    message,
    printable,
)

EVIDENCE_LINES = 5  # kept per cause (the first ones: where it started)
ERROR_LINES = 5  # kept when nothing is explained
_KEEP_CHARS = 400  # of a kept line

# What makes a line look like an error when no signature explains it: an exception line, then a
# logger's error level, then the words. A later line wins a tie: the last traceback line is the one.
_EXCEPTION = re.compile(r"^(?:\w+\.){0,8}\w*(?:Error|Exception|Exit|Fault|Failure)\b(?::|$)")
_ERRORISH = re.compile(
    r"(?P<level>\bERROR\b|\bCRITICAL\b|\bFATAL\b|\[Error\]|Traceback \(most recent call last\))"
    r"|\b(?i:error|failed|failure|fatal|segmentation fault|core dumped|killed)\b"
)


@dataclass(frozen=True, slots=True)
class Line:
    number: int | None  # None after a skipped stretch
    offset: int  # byte offset of the line's start
    text: str


@dataclass
class Evidence:
    signature: Signature
    first: LineMatch
    lines: list[Line] = field(default_factory=list)
    count: int = 0


@dataclass
class Scan:
    """What one log gave; `evidence` in the order causes were first seen."""

    lines: int = 0  # lines looked at
    bytes_read: int = 0
    skipped: list[tuple[int, int]] = field(default_factory=list)  # (byte offset, bytes) left out
    overlong_lines: int = 0
    binary_bytes: int = 0  # NUL bytes seen: a binary file, not a log
    evidence: dict[str, Evidence] = field(default_factory=dict)
    errors: list[tuple[int, int, Line]] = field(default_factory=list)  # heap of (score, offset, line)

    def error_like(self) -> list[Line]:
        """The lines that looked most like an error, in the order of the log."""
        return [line for _score, _offset, line in sorted(self.errors, key=lambda e: e[1])]


class Scanner:
    """Feed bytes as they come; `finish()` flushes the last line and gives the `Scan`."""

    def __init__(self) -> None:
        self.scan = Scan()
        self._partial = bytearray()
        self._partial_cut = False  # the current line passed the limit: the rest of it is dropped
        self._offset = 0  # where the next byte fed sits in the log
        self._line_start = 0
        self._numbered = True  # False once a stretch was skipped

    def feed(self, data: bytes) -> None:
        self.scan.bytes_read += len(data)
        self.scan.binary_bytes += data.count(b"\x00")
        base = self._offset
        self._offset += len(data)
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                self._hold(data[start:])
                return
            self._hold(data[start:end])
            self._line_done()
            self._line_start = base + end + 1
            start = end + 1

    def skip(self, nbytes: int) -> None:
        """The caller left out the next `nbytes` (the middle of a huge file): the line in progress is
        ended there, and lines after the gap carry byte offsets only."""
        if self._partial or self._partial_cut:
            self._line_done()
        self.scan.skipped.append((self._offset, nbytes))
        self._offset += nbytes
        self._line_start = self._offset
        self._numbered = False

    def finish(self) -> Scan:
        if self._partial or self._partial_cut:
            self._line_done()
        return self.scan

    def _hold(self, piece: bytes) -> None:
        room = MAX_LINE_CHARS * 4 - len(self._partial)  # UTF-8: at most 4 bytes a character
        if len(piece) > room:
            self._partial += piece[: max(room, 0)]
            self._partial_cut = True
        else:
            self._partial += piece

    def _line_done(self) -> None:
        self.scan.lines += 1
        if self._partial_cut:
            self.scan.overlong_lines += 1
        raw = self._partial.decode("utf-8", "replace").replace("\x00", "")
        self._partial.clear()
        self._partial_cut = False
        self._look_at(self.scan.lines if self._numbered else None, raw)

    def _look_at(self, number: int | None, raw: str) -> None:
        text = message(raw)
        found = match_message(text)
        line = Line(number, self._line_start, printable(raw.strip()[:_KEEP_CHARS]))
        if found is not None:
            ev = self.scan.evidence.get(found.signature.id)
            if ev is None:
                ev = self.scan.evidence[found.signature.id] = Evidence(found.signature, found)
            ev.count += 1
            if len(ev.lines) < EVIDENCE_LINES:
                ev.lines.append(line)
            return
        if _EXCEPTION.match(text):
            score = 3
        else:
            errorish = _ERRORISH.search(raw, 0, MAX_LINE_CHARS)
            if errorish is None:
                return
            score = 2 if errorish.group("level") else 1
        entry = (score, line.offset, line)
        heap = self.scan.errors
        if len(heap) < ERROR_LINES:
            heapq.heappush(heap, entry)
        elif entry[:2] > heap[0][:2]:
            heapq.heapreplace(heap, entry)
