"""What this host (or --root) says about each cause a log names: the cause's checks are run through the
registry, never inferred from the log's words.

A check that fails or warns confirms the cause; one that passes rules it out (the host is fixed now:
the log predates the fix or came from another machine); a check skipped or broken cannot tell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rocmdoctor.model import Status

if TYPE_CHECKING:
    from rocmdoctor.registry import Context, Outcome

CONFIRMED = "confirmed"
RULED_OUT = "ruled_out"
CANNOT_TELL = "cannot_tell"
NO_CHECK = "no_check"  # nothing on a host can say (a Hugging Face refusal, a model's head_dim)


@dataclass(frozen=True, slots=True)
class Verdict:
    verdict: str
    says: str
    checks: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "says": self.says, "checks": self.checks}


def run_checks(ctx: Context, check_ids: set[str]) -> dict[str, Outcome]:
    """Each asked check (and what it depends on) run once on the host."""
    if not check_ids:
        return {}
    from rocmdoctor.checks import load_registry

    registry = load_registry()
    specs = registry.select(sorted(check_ids))
    return {o.spec.id: o for o in registry.run(ctx, specs)}


def verdict(check_ids: tuple[str, ...], host_problem: bool, outcomes: dict[str, Outcome]) -> Verdict:
    if not host_problem:
        return Verdict(NO_CHECK, "not a host problem: nothing on this host can change it")
    if not check_ids:
        return Verdict(NO_CHECK, "no host check can confirm this cause; the log line is the evidence")
    rows = [
        {"id": cid, "status": outcomes[cid].result.status.value, "summary": outcomes[cid].result.summary}
        for cid in check_ids
        if cid in outcomes
    ]
    bad = [r for r in rows if r["status"] in (Status.FAIL.value, Status.WARN.value)]
    if bad:
        said = "; ".join(f"{r['id']} {r['status']}: {r['summary']}" for r in bad)
        return Verdict(CONFIRMED, f"this host has it: {said}", rows)
    if rows and all(r["status"] == Status.PASS.value for r in rows):
        said = "; ".join(f"{r['id']}: {r['summary']}" for r in rows)
        return Verdict(
            RULED_OUT, f"the host passes {said}; this log predates that or came from elsewhere", rows
        )
    said = "; ".join(f"{r['id']} {r['status']}: {r['summary']}" for r in rows) or "the checks did not run"
    return Verdict(CANNOT_TELL, f"cannot tell from this host ({said})", rows)
