"""Read vLLM's /metrics: the Prometheus text exposition format, just enough to sum counters.

Lines look like `vllm:generation_tokens_total{engine="0",model_name="tiny"} 42.0 [timestamp]`;
`#` lines are HELP/TYPE comments. Label values may hold escaped quotes, backslashes and newlines.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class MetricsFormatError(ValueError):
    pass


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def _unescape(raw: str) -> str:
    return re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], raw)


def _parse_value(raw: str, line: str) -> float:
    special = {"+Inf": math.inf, "-Inf": -math.inf, "NaN": math.nan}
    if raw in special:
        return special[raw]
    try:
        return float(raw)
    except ValueError:
        raise MetricsFormatError(f"not a sample value {raw!r} in {line!r}") from None


def _parse_line(line: str) -> Sample:
    name_match = _NAME.match(line)
    if not name_match:
        raise MetricsFormatError(f"not a metric line: {line!r}")
    pos = name_match.end()
    labels: dict[str, str] = {}
    if line[pos : pos + 1] == "{":
        pos += 1
        while True:
            if line[pos : pos + 1] == "}":
                pos += 1
                break
            label = _LABEL.match(line, pos)
            if not label:
                raise MetricsFormatError(f"bad label set in {line!r}")
            labels[label.group(1)] = _unescape(label.group(2))
            pos = label.end()
    fields = line[pos:].split()
    if not fields:
        raise MetricsFormatError(f"no value in {line!r}")
    return Sample(name_match.group(0), labels, _parse_value(fields[0], line))


def parse(text: str) -> list[Sample]:
    return [
        _parse_line(line.strip())
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def counter_sum(samples: list[Sample], name: str, **labels: str) -> float | None:
    """The sum of every sample of `name` whose labels include `labels`; None when there is none."""
    values = [
        s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    return sum(values) if values else None
