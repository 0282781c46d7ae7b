"""The context probe's pure parts: the ladder, degenerate answers, the shape of a probe's answer."""

from __future__ import annotations

import math

import pytest

from rocmdoctor.provision.verify import openai_schema as schema
from rocmdoctor.provision.verify.context_probe import GENERATED, degenerate, ladder

PATH = "/v1/completions"


def test_the_ladder_climbs_in_powers_of_two_to_the_last_length_that_fits():
    assert ladder(512) == [16, 32, 64, 128, 256, 511]
    # a boundary is checked on both sides of it; lengths too short to hold the generated tokens go
    assert ladder(4096, (2048, 1000, 3)) == [16, 32, 64, 128, 256, 512, 1000, 1001, 1024, 2048, 2049, 4095]
    assert ladder(GENERATED + 3) == [GENERATED + 2]


@pytest.mark.parametrize(
    ("text", "ids", "why"),
    [
        ("", [], "empty"),
        ("  \n", [5], "empty"),
        ("\ufffd\ufffdab", [1, 2], "U+FFFD"),
        ("itititit", [364, 364, 364, 364], "repeated 4 times"),
    ],
)
def test_degenerate_answers_are_named(text, ids, why):
    assert why in (degenerate(text, ids) or "")


def test_ordinary_text_is_not_degenerate():
    assert degenerate(" marigold.", [11, 12, 13]) is None
    assert degenerate("ab\ufffd", [1, 2, 3]) is None  # one stray byte in three characters
    assert degenerate("aaa", [7, 7, 7]) is None  # too short to call a repetition


def _answer(**choice):
    return {"choices": [{"text": "x", **choice}], "usage": {"completion_tokens": 1}}


def test_a_probe_answer_is_read_by_token_id():
    answer = schema.probe_answer(
        PATH,
        _answer(
            token_ids=[7],
            logprobs={"token_logprobs": [-0.5], "top_logprobs": [{"token_id:7": -0.5, "token_id:9": -1.75}]},
            prompt_logprobs=[None, {"7": {"logprob": -0.25, "rank": 1, "decoded_token": "a"}}],
        ),
        1,
    )
    assert answer.token_ids == [7] and answer.logprobs == [-0.5] and answer.margins == [1.25]
    assert answer.prompt_logprobs == [None, {7: schema.Ranked(-0.25, 1)}]


@pytest.mark.parametrize(
    ("choice", "field"),
    [
        ({"prompt_logprobs": [None, {"x7": {"logprob": -1.0}}]}, "not a token id"),
        ({"prompt_logprobs": [None, {"7": {"logprob": math.nan}}]}, "not a log-probability"),
        ({"prompt_logprobs": [None, {"7": {"logprob": 0.5}}]}, "not a log-probability"),
        ({"prompt_logprobs": {"7": -1}}, "not a list"),
        ({"token_ids": [1, 2, 3]}, "more than max_tokens 1"),
        ({"token_ids": ["a"]}, "not a whole number"),
    ],
)
def test_a_misshapen_probe_answer_names_the_field(choice, field):
    with pytest.raises(schema.ShapeError, match=field):
        schema.probe_answer(PATH, _answer(**choice), 1)


def test_max_model_len_is_the_served_models():
    models = {"data": [{"id": "a", "max_model_len": 4096}, {"id": "b"}]}
    assert schema.max_model_len("/v1/models", models, "a") == 4096
    assert schema.max_model_len("/v1/models", models, "b") is None
    with pytest.raises(schema.ShapeError, match="negative"):
        schema.max_model_len("/v1/models", {"data": [{"id": "a", "max_model_len": -1}]}, "a")


class _Unbounded:
    """What `climb` reads of a client: a server without a deadline."""

    class server:  # the attribute the probe reads
        deadline = None


def _probe(budget):
    from rocmdoctor.provision.verify.context_probe import Probe, ProbeOptions

    return Probe(_Unbounded(), ProbeOptions("m", 4096, budget_tokens=budget), [1, 2, 3])  # type: ignore[arg-type]


def _wrong_past(threshold, seen):
    from rocmdoctor.provision.verify.context_probe import Check

    async def run_one(length):
        seen.append(length)
        return Check(length, "inconsistent" if length > threshold else "consistent")

    return run_one


@pytest.mark.parametrize("threshold", [700, 1024, 1025, 2047, 3000])
def test_the_climb_bisects_to_the_first_failing_length(threshold):
    import asyncio

    from rocmdoctor.provision.verify.context_probe import climb

    seen: list[int] = []
    result = asyncio.run(climb(_probe(None), ladder(4096), _wrong_past(threshold, seen)))
    assert result.first_failing == threshold + 1 and result.longest_ok == threshold
    assert result.stopped is None
    assert len(seen) <= len(ladder(4096)) + 12  # the ladder up to the failure, then log2 of the gap


def test_the_climb_stops_where_the_budget_ends_and_says_so():
    import asyncio

    from rocmdoctor.provision.verify.context_probe import climb

    seen: list[int] = []
    probe = _probe(1000)
    result = asyncio.run(climb(probe, ladder(4096), _wrong_past(10**6, seen)))
    # each check is charged as the run spends it; here nothing is spent, so the budget bounds by length
    assert seen == [n for n in ladder(4096) if 2 * n <= 1000]
    assert result.first_failing is None and result.longest_ok == seen[-1]
    assert "budget of 1000 prompt tokens" in (result.stopped or "")


def test_the_runs_deadline_ending_a_check_is_a_stop_not_a_failure():
    import asyncio
    import time

    from rocmdoctor.provision.verify import openai_client as oc
    from rocmdoctor.provision.verify.context_probe import Check, climb

    probe = _probe(None)
    deadline = {"at": None}
    probe.client = type(
        "C", (), {"server": type("S", (), {"deadline": property(lambda _: deadline["at"])})()}
    )()

    async def run_one(length):
        if length < 256:
            return Check(length, "consistent")
        deadline["at"] = time.monotonic() - 1  # the run's --timeout ends during this check
        raise oc.ServerError(oc.TIMEOUT, "no answer within 30 s")

    result = asyncio.run(climb(probe, ladder(4096), run_one))
    assert result.longest_ok == 128 and result.first_failing is None
    assert "deadline came during a check" in (result.stopped or "")

    async def stalls(length):
        raise oc.ServerError(oc.TIMEOUT, "no answer within 30 s")  # a stall with time left: the server's

    deadline["at"] = None
    with pytest.raises(oc.ServerError):
        asyncio.run(climb(probe, ladder(4096), stalls))
