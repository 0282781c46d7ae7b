"""The context probe on the real vLLM CPU engine, and on the same engine behind a faulty proxy.

The engine serves the shared tiny Llama with seeded random weights (harness.weighted_model: the
shared engine's dummy weights give flat logits, on which nothing can be judged). Its own answers
must be consistent at every length up to max_model_len; the proxy that scores the prefill path from
a shortened context past a length must be caught at that length, by both probes, and one that
degenerates must be caught as such.
"""

from __future__ import annotations

import pytest
from jsonschema import validate

from harness.context_proxy import Fault, context_proxy
from harness.engine import start_engine
from harness.smoke_cli import rocmdoctor_json, steps_by_id
from harness.weighted_model import LOAD_REAL_WEIGHTS, make_weighted_tiny_model
from rocmdoctor.provision.verify.context_probe import GENERATED, NEEDLE_TOKENS, ladder
from rocmdoctor.report import load_schema

MAX_MODEL_LEN = 512  # start_engine's
SHORTEN_PAST = 200


@pytest.fixture(scope="module")
def weighted_engine(tmp_path_factory: pytest.TempPathFactory):
    model = make_weighted_tiny_model(tmp_path_factory.mktemp("context-probe-model"))
    log = tmp_path_factory.mktemp("context-probe-engine") / "vllm.log"
    with start_engine(model, log_path=log, extra_args=LOAD_REAL_WEIGHTS) as engine:
        yield engine


def _context(url: str, *extra: str) -> tuple[int, dict]:
    code, report = rocmdoctor_json("smoke", "--url", url, "--context-probe", "on", "--timeout", "120", *extra)
    validate(report, load_schema("smoke-report.schema.json"))
    return code, steps_by_id(report)["context"]


def test_the_real_engine_is_consistent_at_every_length_up_to_max_model_len(weighted_engine):
    code, step = _context(weighted_engine.base_url)
    assert code == 0 and step["status"] == "pass", step
    consistency = step["details"]["consistency"]
    assert (
        step["details"]["ladder"] == ladder(MAX_MODEL_LEN) and ladder(MAX_MODEL_LEN)[-1] == MAX_MODEL_LEN - 1
    )
    assert [c["length"] for c in consistency["checks"]] == ladder(MAX_MODEL_LEN)
    assert {c["verdict"] for c in consistency["checks"]} == {"consistent"}, consistency
    assert consistency["longest_consistent"] == MAX_MODEL_LEN - 1
    assert all(c["decisive_positions"] > 0 for c in consistency["checks"]), consistency
    cost = step["details"]["cost"]
    assert cost["seconds"] > 0 and cost["prompt_tokens"] >= 2 * sum(ladder(MAX_MODEL_LEN)) - 8 * len(
        ladder(MAX_MODEL_LEN)
    ), cost
    # random weights cannot retrieve a code word: the needle probe says so, and fails nothing
    assert step["details"]["needle"]["verdict"] == "cannot_judge", step


def _step_after(first_failing: int, threshold: int) -> bool:
    """Within one ladder step above the real threshold (the first length that is wrong)."""
    above = [n for n in ladder(MAX_MODEL_LEN) if n >= threshold]
    return threshold <= first_failing <= above[0]


def test_a_server_wrong_past_a_length_is_caught_there_by_both_probes(weighted_engine):
    fault = Fault(shorten_past=SHORTEN_PAST)
    with context_proxy(weighted_engine.base_url, fault) as url:
        code, step = _context(url)
    assert code == 1 and step["status"] == "fail", step
    assert fault.shortened, "the proxy never corrupted a request"
    consistency, needle = step["details"]["consistency"], step["details"]["needle"]
    # the first wrong prefill context is SHORTEN_PAST + 1 tokens
    assert consistency["verdict"] == "inconsistent"
    assert _step_after(consistency["first_inconsistent"], SHORTEN_PAST + 1), consistency
    assert consistency["longest_consistent"] < consistency["first_inconsistent"]
    assert f"from {consistency['first_inconsistent']} tokens" in step["summary"]
    mismatch = next(c["mismatch"] for c in consistency["checks"] if c["mismatch"])
    assert mismatch["position"] >= SHORTEN_PAST - GENERATED, mismatch
    # the needle: found in the short control, lost once the prompt passes SHORTEN_PAST
    assert needle["verdict"] == "wrong" and needle["control"]["found"], needle
    assert _step_after(needle["first_wrong"] - NEEDLE_TOKENS, SHORTEN_PAST + 1), needle


def test_a_server_that_degenerates_is_caught_as_such(weighted_engine):
    with context_proxy(weighted_engine.base_url, Fault(degenerate=True)) as url:
        code, step = _context(url)
    assert code == 1 and step["status"] == "fail", step
    assert step["summary"].startswith("degenerate output"), step
    assert "repeated" in step["details"]["needle"]["control"]["degenerate"]


def test_context_probe_off_is_a_skip_that_says_so(weighted_engine):
    code, report = rocmdoctor_json("smoke", "--url", weighted_engine.base_url, "--context-probe", "off")
    step = steps_by_id(report)["context"]
    assert code == 0 and step["status"] == "skip" and "off" in step["summary"], step
