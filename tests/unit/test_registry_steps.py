"""`registry.Steps`: async steps over a caller's context with the checks' rule (dependents of a step
that did not pass are skipped, an exception is an error result), as smoke declares its steps."""

from __future__ import annotations

import asyncio

import pytest

from rocmdoctor.model import Result, Status, failed, passed, skipped
from rocmdoctor.registry import RegistryError, StepFn, Steps, StepSpec, blocked_result


def recorder(name: str, outcome: Result | Exception) -> StepFn[list[str]]:
    """A step that notes it ran, then returns `outcome` (or raises it)."""

    async def step(seen: list[str]) -> Result:
        seen.append(name)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    return step


def declared() -> Steps[list[str]]:
    steps: Steps[list[str]] = Steps()
    for name, title, depends, outcome in [
        ("a", "first", (), passed("a ok")),
        ("b", "fails", ("a",), failed("b broke", "fix b")),
        ("c", "needs b", ("b",), passed("never")),
        ("d", "raises", ("a",), KeyError("boom")),
        ("e", "needs the crashed one", ("d",), passed("never")),
        ("f", "independent", (), passed("f ok")),
    ]:
        steps.step(name, title, depends=depends)(recorder(name, outcome))
    return steps


def test_dependents_of_a_failure_or_a_crash_are_skipped_and_the_rest_runs():
    seen: list[str] = []
    outcomes = asyncio.run(declared().run(seen))
    assert seen == ["a", "b", "d", "f"]
    by_id = {o.spec.id: o.result for o in outcomes}
    assert [o.spec.id for o in outcomes] == ["a", "b", "c", "d", "e", "f"]
    assert by_id["c"] == blocked_result("b")  # the very skip a check's dependent gets
    assert by_id["d"].status is Status.ERROR and "KeyError" in by_id["d"].summary
    assert "step" in by_id["d"].summary and "traceback" in by_id["d"].details
    assert by_id["e"].status is Status.SKIP and by_id["e"].details == {"skipped_because_of": "d"}
    assert by_id["f"].status is Status.PASS
    assert all(o.duration_s >= 0 for o in outcomes)


def test_a_precondition_skips_before_the_dependency_rule_and_blocked_words_the_skip():
    seen: list[str] = []

    def stop_after_b(spec: StepSpec[list[str]]) -> Result | None:
        return skipped("the server is gone") if "b" in seen and spec.id != "c" else None

    outcomes = asyncio.run(
        declared().run(seen, stop_after_b, lambda blocker: skipped(f"needs the {blocker!r} step"))
    )
    assert seen == ["a", "b"]
    summaries = {o.spec.id: o.result.summary for o in outcomes}
    assert summaries["c"] == "needs the 'b' step"  # the precondition let c through to the rule
    assert summaries["d"] == summaries["e"] == summaries["f"] == "the server is gone"


def test_declaration_errors_are_caught_at_declaration():
    steps: Steps[None] = Steps()

    async def ok(_ctx: None) -> Result:
        return passed("ok")

    with pytest.raises(RegistryError, match="not declared before"):
        steps.step("x", "x", depends=("y",))(ok)
    steps.step("y", "y")(ok)
    with pytest.raises(RegistryError, match="duplicate step id"):
        steps.step("y", "again")(ok)


def test_a_step_that_returns_no_result_is_an_error_not_a_crash():
    steps: Steps[None] = Steps()

    @steps.step("bad", "returns a string")
    async def bad(_ctx: None) -> Result:
        return "pass"  # type: ignore[return-value]

    (outcome,) = asyncio.run(steps.run(None))
    assert outcome.result.status is Status.ERROR and "returned str, not Result" in outcome.result.summary


def test_smoke_declares_its_steps_with_their_prerequisites():
    from rocmdoctor.provision.verify.smoke import SMOKE

    assert [(s.id, s.depends) for s in SMOKE.specs] == [
        ("health", ()),
        ("models", ("health",)),
        ("completion", ("models",)),
        ("chat", ("models",)),
        ("chat-stream", ("models",)),
        ("determinism", ("completion",)),
        ("metrics", ("completion",)),
        ("version", ("health",)),
        ("context", ("completion",)),
    ]
