"""`rocmdoctor smoke`: prove that a vLLM OpenAI server really serves, step by step.

A green /health is not enough (an engine can die after start, a served name can differ, a proxy can
cut streams), so every step sends real requests and a failure names its likely cause.

`--timeout` is the whole run's deadline: every request ends by it (connect to last byte), and the
steps it leaves no time for are skipped, so the command ends by then however the server behaves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rocmdoctor import __version__
from rocmdoctor.model import (
    Result,
    Status,
    envelope,
    exit_code,
    failed,
    passed,
    skipped,
    warned,
)
from rocmdoctor.provision.verify import context_probe as context_probe_module
from rocmdoctor.provision.verify import openai_client as oc
from rocmdoctor.provision.verify import openai_schema as schema
from rocmdoctor.provision.verify import prometheus
from rocmdoctor.registry import StepOutcome, Steps, StepSpec

MAX_TOKENS = 16
PROMPT = "The server answers the prompt"
CHAT = [{"role": "user", "content": "Say hello to the user."}]
# vLLM updates its counters just after the last response; give them this long to settle.
METRICS_SETTLE_S = 5.0

LOG_HINT = (
    "read the vLLM log for the first error (`journalctl -u vllm`, or the --log-file of `rocmdoctor serve`)"
)


@dataclass(frozen=True)
class SmokeOptions:
    url: str
    model: str = "auto"
    api_key: str | None = None
    timeout_s: float = 30.0
    # Behind Lemonade: its health path, and vLLM's own address for /metrics and /version.
    health_path: str = "/health"
    backend_url: str | None = None
    # auto: the context probe up to where DEFAULT_BUDGET_TOKENS ends; on: up to max_model_len; off
    context_probe: str = "auto"
    dtype: str = context_probe_module.DEFAULT_DTYPE
    boundaries: tuple[int, ...] = ()


@dataclass
class _State:
    """What the steps learn and hand to later ones."""

    client: oc.Client
    options: SmokeOptions
    model: str | None = None
    served: list[str] = field(default_factory=list)
    baseline: list[prometheus.Sample] | None = None
    baseline_error: oc.ServerError | None = None
    completion_text: str | None = None
    chat_tokens: int | None = None
    requests_ok: int = 0
    tokens_generated: int = 0
    # Set once the server is gone, dead or stalled: later steps would only repeat the failure.
    stop_reason: str | None = None


class StepFailed(Exception):
    def __init__(self, result: Result) -> None:
        super().__init__(result.summary)
        self.result = result


StepFn = Callable[[_State], Awaitable[Result]]
# The steps, in the order they run; a step runs only when the steps it depends on passed (or warned).
SMOKE: Steps[_State] = Steps()


def smoke_step(id: str, title: str, *, depends: Iterable[str] = ()) -> Callable[[StepFn], StepFn]:
    """Declare a step; a request that fails becomes the finding `explain` gives for it."""

    def declare(fn: StepFn) -> StepFn:
        async def guarded(state: _State) -> Result:
            try:
                return await fn(state)
            except StepFailed as exc:
                return exc.result
            except oc.ServerError as exc:
                return await explain(state, exc)

        SMOKE.step(id, title, depends=depends)(guarded)
        return fn

    return declare


async def _health_now(client: oc.Client) -> str:
    """'ok', 'dead' (503: engine died) or 'gone' (nothing answers), to name the cause of a failure."""
    try:
        await client.health()
        return "ok"
    except oc.ServerError as exc:
        return "dead" if exc.status == 503 else "gone"


async def explain(state: _State, exc: oc.ServerError) -> Result:
    """Turn a request failure into a finding with a remedy, probing /health to tell the causes apart."""
    options = state.options
    if exc.kind == oc.UNAUTHORIZED:
        if options.api_key:
            return failed(
                f"the server rejected the API key ({exc})",
                "pass the key vLLM was started with (--api-key or VLLM_API_KEY) in --api-key-file",
            )
        return failed(
            f"the server requires an API key ({exc})",
            "pass --api-key-file FILE holding the key vLLM was started with (--api-key or VLLM_API_KEY)",
        )
    if exc.kind == oc.MODEL_NOT_FOUND:
        return failed(
            f"model {state.model!r} is not served ({exc})",
            f"use --model auto or one of {state.served}, or restart vLLM with "
            f"--served-model-name {state.model}",
        )
    if exc.kind == oc.TIMEOUT:
        state.stop_reason = "the server stopped answering"
        return failed(
            f"{exc}: the server accepts connections but does not finish answering",
            f"it may be stuck or overloaded: {LOG_HINT}; raise --timeout if it is only slow",
        )
    if exc.kind == oc.BAD_RESPONSE:
        return failed(
            str(exc),
            "the answer does not have the shape or size the OpenAI API defines: check that --url points "
            f"at vLLM's OpenAI-compatible server (not a proxy that rewrites answers); {LOG_HINT}",
        )
    health = await _health_now(state.client)
    if health == "gone":
        state.stop_reason = "the server is gone"
        return failed(
            f"the server went away during the test ({exc}; /health no longer answers)",
            f"the vLLM process exited: {LOG_HINT} (often out of memory), then restart it",
        )
    if health == "dead":
        state.stop_reason = "the engine is dead"
        return failed(
            f"the engine died during the test ({exc}; /health now answers 503)",
            f"{LOG_HINT}, then restart the server",
        )
    if exc.kind == oc.STREAM_CUT:
        return failed(
            f"{exc} although /health is still 200",
            "a proxy in between or the server cut the stream: try the server's own port, "
            f"check proxy buffering and timeouts, {LOG_HINT}",
        )
    if exc.kind == oc.DISCONNECTED:
        return failed(f"{exc} although /health is still 200", f"{LOG_HINT}; check any proxy in between")
    return failed(
        f"/health is 200 but requests fail: {exc}", f"the engine reports healthy but cannot serve: {LOG_HINT}"
    )


def _usage_tokens(path: str, answer: schema.Completion) -> int:
    tokens = answer.usage.completion_tokens if answer.usage else None
    if not tokens:
        raise StepFailed(
            failed(
                f"{path} returned no usage.completion_tokens (usage={answer.usage})",
                "check that --url points at vLLM's OpenAI-compatible server",
            )
        )
    return tokens


def _non_empty(path: str, text: str | None) -> str:
    if not text:
        raise StepFailed(
            failed(
                f"{path} returned empty text",
                f"the model produced nothing for a {MAX_TOKENS}-token request: {LOG_HINT}",
            )
        )
    return text


def _completion_body(state: _State) -> dict[str, Any]:
    # ignore_eos makes the answer exactly MAX_TOKENS long, so every count can be checked.
    return {
        "model": state.model,
        "prompt": PROMPT,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }


def _chat_body(state: _State) -> dict[str, Any]:
    return {
        "model": state.model,
        "messages": CHAT,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
    }


@smoke_step("health", "GET /health")
async def step_health(state: _State) -> Result:
    try:
        await state.client.health()
    except oc.ServerError as exc:
        if exc.kind == oc.UNREACHABLE:
            state.stop_reason = "nothing answers"
            return Result(
                Status.ERROR,
                f"nothing answers at {state.options.url}: {exc}",
                "start the server (`rocmdoctor serve`, or `systemctl start vllm`) or point --url at it",
            )
        if exc.status == 503:
            state.stop_reason = "the engine is dead"
            return failed("/health answers 503: the engine is dead", f"{LOG_HINT}, then restart the server")
        return await explain(state, exc)
    return passed("/health answers 200")


@smoke_step("models", "GET /v1/models", depends=("health",))
async def step_models(state: _State) -> Result:
    state.served = await state.client.models()
    if not state.served:
        return failed(
            "/v1/models lists no model", "check that --url points at vLLM's OpenAI-compatible server"
        )
    wanted = state.options.model
    if wanted == "auto":
        state.model = state.served[0]
        return passed(f"serves {state.model!r}", served=state.served)
    state.model = wanted
    if wanted not in state.served:
        return failed(
            f"model {wanted!r} is not served; the server serves {state.served}",
            f"use --model {state.served[0]} (or --model auto), or restart vLLM with "
            f"--served-model-name {wanted}",
            served=state.served,
        )
    return passed(f"serves {wanted!r}", served=state.served)


@smoke_step("completion", "POST /v1/completions", depends=("models",))
async def step_completion(state: _State) -> Result:
    try:
        state.baseline = await state.client.metrics()
    except oc.ServerError as exc:
        if exc.kind == oc.TIMEOUT:
            raise  # a stalled server: the step fails on it rather than wait again for the completion
        state.baseline, state.baseline_error = None, exc  # the metrics step reports it
    answer = await state.client.completion("/v1/completions", _completion_body(state))
    text = _non_empty("/v1/completions", answer.text)
    tokens = _usage_tokens("/v1/completions", answer)
    state.completion_text = text
    state.requests_ok += 1
    state.tokens_generated += tokens
    return passed(f"{tokens} tokens of text", completion_tokens=tokens, text=text[:80])


@smoke_step("chat", "POST /v1/chat/completions", depends=("models",))
async def step_chat(state: _State) -> Result:
    answer = await state.client.completion("/v1/chat/completions", _chat_body(state))
    text = _non_empty("/v1/chat/completions", answer.text)
    tokens = _usage_tokens("/v1/chat/completions", answer)
    state.chat_tokens = tokens
    state.requests_ok += 1
    state.tokens_generated += tokens
    return passed(f"{tokens} tokens of chat reply", completion_tokens=tokens, text=text[:80])


@smoke_step("chat-stream", "streamed chat with usage", depends=("models",))
async def step_chat_stream(state: _State) -> Result:
    streamed = await state.client.stream("/v1/chat/completions", _chat_body(state))
    _non_empty("/v1/chat/completions (stream)", streamed.text)
    if streamed.output_tokens is None:
        return failed(
            "the stream's final chunk carries no usage",
            "the server ignores stream_options.include_usage: upgrade vLLM, or start it with "
            "--enable-force-include-usage",
        )
    state.requests_ok += 1
    state.tokens_generated += streamed.output_tokens
    details = {"chunks": len(streamed.chunk_times), "completion_tokens": streamed.output_tokens}
    if state.chat_tokens is not None and streamed.output_tokens != state.chat_tokens:
        return failed(
            f"the stream reports {streamed.output_tokens} tokens, the same request unstreamed "
            f"{state.chat_tokens}",
            f"the server's token accounting is inconsistent: {LOG_HINT}",
            **details,
        )
    return passed(
        f"{len(streamed.chunk_times)} chunks to [DONE], usage {streamed.output_tokens} tokens "
        "agrees with the unstreamed reply",
        **details,
    )


@smoke_step("determinism", "greedy determinism", depends=("completion",))
async def step_determinism(state: _State) -> Result:
    answer = await state.client.completion("/v1/completions", _completion_body(state))
    text = answer.text
    state.requests_ok += 1
    state.tokens_generated += _usage_tokens("/v1/completions", answer)
    if state.completion_text is None:
        return skipped("no first completion to compare with")
    if text != state.completion_text:
        return warned(
            "temperature 0 gave two different answers to the same prompt",
            "batch-dependent kernels can cause this; if answers must be reproducible, check "
            "the attention backend and that no other traffic shares the server",
            first=state.completion_text[:80],
            second=(text or "")[:80],
        )
    return passed("temperature 0 gives the same answer twice")


def _metric_growth(state: _State, now: list[prometheus.Sample], name: str) -> float | None:
    model = state.model or ""
    labels = {"model_name": model} if oc.counter(now, name, model_name=model) is not None else {}
    after = oc.counter(now, name, **labels)
    before = oc.counter(state.baseline or [], name, **labels)
    if after is None or before is None:
        return None
    return after - before


@smoke_step("metrics", "GET /metrics counters", depends=("completion",))
async def step_metrics(state: _State) -> Result:
    if state.baseline is None and state.baseline_error and state.baseline_error.kind == oc.BAD_RESPONSE:
        raise state.baseline_error  # an answer too large or not Prometheus text: a failure, not a gap
    if state.baseline is None:
        return warned(
            "/metrics could not be read or parsed before the requests",
            "vLLM serves Prometheus metrics at /metrics; check that nothing in front of it blocks that path",
        )
    expected = {
        "vllm:request_success_total": state.requests_ok,
        "vllm:generation_tokens_total": state.tokens_generated,
    }
    deadline = time.monotonic() + METRICS_SETTLE_S
    if state.client.server.deadline is not None:
        deadline = min(deadline, state.client.server.deadline - 0.5)
    while True:
        now = await state.client.metrics()
        measured = {name: _metric_growth(state, now, name) for name in expected}
        missing = [name for name, grown in measured.items() if grown is None]
        if missing:
            return warned(
                f"/metrics lacks {missing}",
                "start vLLM without --disable-log-stats so it counts requests and tokens",
            )
        growth = {name: grown or 0.0 for name, grown in measured.items()}
        if all(growth[n] >= expected[n] for n in expected) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    details = {"expected": expected, "growth": growth}
    if any(growth[n] < expected[n] for n in expected):
        return failed(
            f"the server counted less than was sent: {growth} for {expected}",
            f"the engine did not account for finished requests: {LOG_HINT}",
            **details,
        )
    if growth != expected:
        return warned(
            f"counters grew by more than this test sent: {growth} for {expected}",
            "other clients are using the server; rerun on an idle server to check the counters",
            **details,
        )
    return passed(
        f"{state.requests_ok} requests and {state.tokens_generated} generated tokens counted", **details
    )


@smoke_step("version", "GET /version", depends=("health",))
async def step_version(state: _State) -> Result:
    version = await state.client.version()
    if not version:
        return warned("/version gives no version", "check that --url points at a vLLM server")
    return passed(f"vLLM {version}", version=version)


def _context_result(report: dict[str, Any]) -> Result:
    """The probe's evidence as one finding: a wrong answer fails, what cannot be judged is a skip."""
    consistency, needle = report["consistency"], report.get("needle", {"verdict": "off"})
    mml = report["max_model_len"]
    remedy = (
        "the server computes wrong attention past that length: serve with --max-model-len at most the "
        "longest consistent length until the kernels are fixed, try another attention backend, and "
        f"report it with this evidence to the backend's vendor; {LOG_HINT}"
    )
    # degenerate first: such text also disagrees with the prefill path, but this names the cause
    if needle["verdict"] == "degenerate":
        return failed(f"degenerate output: {needle.get('why') or _needle_failure(needle)}", remedy, **report)
    if consistency["verdict"] == "inconsistent":
        longest = consistency["longest_consistent"]
        return failed(
            f"prefill and decode disagree from {consistency['first_inconsistent']} tokens of context "
            + (f"(consistent up to {longest} of max_model_len {mml})" if longest else "(at every length)"),
            remedy,
            **report,
        )
    if needle["verdict"] == "wrong":
        return failed(
            f"wrong output above {needle['longest_found']} tokens: the model finds the code word in a "
            f"short prompt but not in one of {needle['first_wrong']} tokens",
            remedy,
            **report,
        )
    if consistency["verdict"] == "cannot_judge" and needle["verdict"] in ("cannot_judge", "off"):
        return skipped(f"cannot judge long-context answers: {consistency['why']}", **report)
    parts = []
    if consistency["verdict"] == "consistent":
        reach = consistency["longest_consistent"]
        parts.append(f"prefill and decode agree at every length checked up to {reach} of {mml} tokens")
        if consistency.get("stopped"):
            parts.append(f"({consistency['stopped']})")
    if needle["verdict"] == "found":
        parts.append(f"the needle is found up to {needle['longest_found']} tokens")
    elif needle["verdict"] == "cannot_judge":
        parts.append("needle: cannot judge with this model")
    cost = report["cost"]
    parts.append(f"[{cost['prompt_tokens']} prompt tokens, {cost['seconds']:g} s]")
    return passed(" ".join(parts), **report)


def _needle_failure(needle: dict[str, Any]) -> str:
    failing = [c for c in needle.get("checks", []) if c["degenerate"]]
    return f"at {failing[0]['length']} tokens: {failing[0]['degenerate']}" if failing else "see the evidence"


@smoke_step("context", "long-context answers (prefill/decode consistency, needle)", depends=("completion",))
async def step_context(state: _State) -> Result:
    options = state.options
    if options.context_probe == "off":
        return skipped("--context-probe off")
    assert state.model is not None
    max_model_len = await state.client.max_model_len(state.model)
    if max_model_len is None:
        return skipped("cannot judge long-context answers: /v1/models gives no max_model_len for the model")
    budget = context_probe_module.DEFAULT_BUDGET_TOKENS if options.context_probe == "auto" else None
    probe_options = context_probe_module.ProbeOptions(
        state.model, max_model_len, options.dtype, options.boundaries, budget
    )
    # declared after metrics: its requests never disturb the counters that step compares
    return _context_result(await context_probe_module.run_probe(state.client, probe_options))


async def run_steps(options: SmokeOptions) -> tuple[list[StepOutcome[_State]], str | None]:
    """Every step in order, each timed; returns the outcomes and the model they used."""
    deadline = time.monotonic() + options.timeout_s
    server = oc.Server(
        options.url, options.api_key, options.timeout_s, deadline, options.health_path, options.backend_url
    )
    async with oc.open_client(server) as client:
        state = _State(client, options)

        def precondition(_spec: StepSpec[_State]) -> Result | None:
            # Once the server is gone or the time is spent, the later steps would only repeat that.
            if state.stop_reason:
                return skipped(state.stop_reason)
            if time.monotonic() >= deadline:
                return skipped(f"the --timeout of {options.timeout_s:g} s is spent")
            return None

        outcomes = await SMOKE.run(
            state, precondition, lambda blocker: skipped(f"needs the {blocker!r} step")
        )
    return outcomes, state.model


def build_report(
    options: SmokeOptions, steps: list[StepOutcome[_State]], model: str | None
) -> dict[str, Any]:
    statuses = [s.result.status for s in steps]
    return envelope(
        tool="rocmdoctor",
        version=__version__,
        command="smoke",
        url=options.url,
        model=model,
        summary={st.value: statuses.count(st) for st in Status} | {"total": len(statuses)},
        exit_code=exit_code(statuses),
        steps=[
            {
                "id": s.spec.id,
                "title": s.spec.title,
                "status": s.result.status.value,
                "summary": s.result.summary,
                "remedy": s.result.remedy,
                "elapsed_s": round(s.duration_s, 4),
                "details": s.result.details,
            }
            for s in steps
        ],
    )


def run_smoke(options: SmokeOptions) -> dict[str, Any]:
    return build_report(options, *asyncio.run(run_steps(options)))
