"""One rule for what stands in the way of an action: `install`, `unit --write`, `serve`, the playbook.

A check's severity says how bad its failure is; only BLOCKING checks can stop an action, and each
declares which actions (`blocks=`, default: serving). A failure or an error (the doctor could not
vouch for the host) of such a check blocks; warnings, skips and the failures of DEGRADING or
ADVISORY checks never do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rocmdoctor.model import Action, Severity, Status
from rocmdoctor.registry import CheckSpec, Outcome

DEFAULT_BLOCKS = (Action.SERVE,)


def blocked_actions(spec: CheckSpec) -> tuple[Action, ...]:
    if spec.severity is not Severity.BLOCKING:
        return ()
    return DEFAULT_BLOCKS if spec.blocks is None else spec.blocks


@dataclass(frozen=True, slots=True)
class Blocker:
    id: str
    summary: str
    remedy: str

    def line(self) -> str:
        return f"{self.id}: {self.summary} -> {self.remedy or 'see `rocmdoctor check`'}"


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    blockers: tuple[Blocker, ...]

    @property
    def blocked(self) -> bool:
        return bool(self.blockers)

    def to_json(self) -> dict[str, Any]:
        return {"blocked": self.blocked, "blocking": [b.id for b in self.blockers]}


def blocking(outcomes: Iterable[Outcome], action: Action) -> Verdict:
    blockers = tuple(
        Blocker(o.spec.id, o.result.summary, o.result.remedy)
        for o in outcomes
        if action in blocked_actions(o.spec) and o.result.status in (Status.FAIL, Status.ERROR)
    )
    return Verdict(action, blockers)


def verdicts(outcomes: Iterable[Outcome]) -> dict[str, dict[str, Any]]:
    """Every action's verdict, for the JSON report (the playbook reads `policy.serve.blocked`)."""
    done = list(outcomes)
    return {action.value: blocking(done, action).to_json() for action in Action}
