"""The result vocabulary shared by every check, command and renderer."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    # The tool itself broke on this host; says nothing about the host's health.
    ERROR = "error"


class Severity(str, Enum):
    """How bad a failure of this check is for serving vLLM (static, declared by the check)."""

    BLOCKING = "blocking"
    DEGRADING = "degrading"
    ADVISORY = "advisory"


class Action(str, Enum):
    """What a failed check can stand in the way of (the policy decides, from each check's severity)."""

    INSTALL = "install"  # put a vLLM bundle on the host
    SERVE = "serve"  # write the unit, start the server (also the fleet's service phase)


class Probe(str, Enum):
    """What running the check costs."""

    PASSIVE = "passive"  # reads files and the environment
    PROCESS = "process"  # walks the process table
    GPU = "gpu"  # starts an interpreter that touches the GPU (opt-in: --deep)


# The version of every JSON document rocmdoctor prints or writes (reports, command envelopes, the lock).
# Bump only on a backward-incompatible change to a layout.
SCHEMA_VERSION = 1

EXIT_OK = 0
EXIT_FAILURES = 1
EXIT_TOOL_ERROR = 2


@dataclass(frozen=True, slots=True)
class Result:
    status: Status
    summary: str
    remedy: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status in (Status.WARN, Status.FAIL) and not self.remedy:
            raise ValueError(f"a {self.status.value} result needs a remedy: {self.summary!r}")


@dataclass(frozen=True, slots=True)
class Row:
    """One judged item, whoever judged it: a check's result, a Lemonade finding, a cluster pre-flight's
    fault, a managed server's health. `subject` names what it is about where the id does not (a node,
    a server); every JSON document carries a row as `to_json` lays it out, and people read it through
    rendering/rows.py."""

    id: str
    result: Result
    subject: str = ""

    @property
    def status(self) -> Status:
        return self.result.status

    def to_json(self) -> dict[str, Any]:
        result = self.result
        return {
            "id": self.id,
            "status": result.status.value,
            "summary": result.summary,
            "remedy": result.remedy,
            "details": result.details,
        }


def passed(summary: str, **details: Any) -> Result:
    return Result(Status.PASS, summary, details=details)


def warned(summary: str, remedy: str, **details: Any) -> Result:
    return Result(Status.WARN, summary, remedy, details)


def failed(summary: str, remedy: str, **details: Any) -> Result:
    return Result(Status.FAIL, summary, remedy, details)


def skipped(summary: str, **details: Any) -> Result:
    return Result(Status.SKIP, summary, details=details)


def exit_code(statuses: list[Status]) -> int:
    """0: no failure; 1: a failure (a finding about the host outranks a doctor bug);
    2: nothing could be judged because every check that ran broke."""
    if Status.FAIL in statuses:
        return EXIT_FAILURES
    judged = {Status.PASS, Status.WARN} & set(statuses)
    if Status.ERROR in statuses and not judged:
        return EXIT_TOOL_ERROR
    return EXIT_OK


@dataclass(frozen=True, slots=True)
class Change:
    """What a provisioning step did or, under --check, would do: Ansible's changed/diff/msg."""

    changed: bool
    msg: str
    diff: str | dict[str, Any] = ""  # a unified diff of files, or state_diff's {before, after}
    data: dict[str, Any] = field(default_factory=dict)

    def envelope(self, **extra: Any) -> dict[str, Any]:
        return envelope(changed=self.changed, msg=self.msg, diff=self.diff, **self.data, **extra)

    def diff_text(self) -> str:
        """The diff for people: a unified diff as it is; a state diff a `-`/`+` line per field."""
        if isinstance(self.diff, str):
            return self.diff
        before, after = self.diff.get("before", {}), self.diff.get("after", {})
        lines = [f"- {key}: {before.get(key)}\n+ {key}: {after.get(key)}\n" for key in {**before, **after}]
        return "".join(lines)


def state_diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Ansible's `{before, after}` diff, only the fields that change: a converged run diffs nothing."""
    keys = [key for key in {**before, **after} if before.get(key) != after.get(key)]
    return {"before": {k: before.get(k) for k in keys}, "after": {k: after.get(k) for k in keys}}


def envelope(**fields: Any) -> dict[str, Any]:
    """The one JSON envelope of every command: schema_version first, then the command's fields."""
    return {"schema_version": SCHEMA_VERSION, **fields}
