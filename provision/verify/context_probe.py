"""Is the served model's output right at long prompts? Two probes, on a ladder of prompt lengths.

A server can pass every short request and answer wrongly once the prompt is long, when a kernel is
wrong only past some length or only on one path (prefill or decode): lemonade-sdk/lemonade#3610
(wrong output above ~5K tokens on gfx1151, its own bench counting 0 failures), llamacpp-rocm PR #97
(gibberish on gfx1152). `/health` and short smoke requests pass such a server.

Consistency (needs no capable model; random weights do): a prompt of N-k tokens, k greedy tokens
generated one by one (the decode path), then the prompt plus those k tokens sent again with
`max_tokens` 1 and `prompt_logprobs` (the prefill path computes all k positions in one pass). A
correct server ranks each generated token first on the prefill path too, or within the dtype's
tolerance of the first (a near-tie, which rounding may break either way, is never a failure). A
length where every position is a near-tie (a model with flat logits) decides nothing.

Needle (needs an instruct model): a code word stated at the start of a long filler is asked for at
the end. A model that fails the short control cannot be judged by it; one that passes the control
and fails at length L answers wrongly above L. Degenerate answers (empty, replacement characters,
one token repeated) are their own finding.

The lengths climb a ladder (powers of two, the boundaries given, max_model_len) and stop at the first
failure; the gap below it is bisected to the first failing length. Every check is bounded: the
tokens it would send count against a budget before it is sent, and the run's deadline bounds time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rocmdoctor.provision.verify import openai_client as oc
from rocmdoctor.provision.verify import openai_schema as schema

# Greedy tokens per consistency check: enough decisive positions on any model, cheap on all.
GENERATED = 8
SHORTEST = 16
# Log-probability tolerance (nats) between the two paths, by the dtype the server computes in:
# bf16 keeps 8 significand bits (relative step 2^-8), fp16 11, fp32 24; logits of a few tens of
# nats then differ by up to ~0.1, ~0.02 and ~1e-5 nats between two correct kernels.
TOLERANCE_NATS = {"bfloat16": 0.1, "float16": 0.05, "float32": 0.01}
# Over HTTP a vLLM server does not say its dtype: the widest tolerance unless the user names it.
DEFAULT_DTYPE = "bfloat16"
# The same token's log-probability on the two paths may differ by rounding; by more than this many
# tolerances the paths computed different distributions even where the argmax agrees (measured on
# the CPU engine: at most 0.002 nats apart when right, 0.5 to 1.1 nats from a context cut short).
LOGPROB_FACTOR = 3
# `smoke`'s default: the whole ladder when it costs at most this many prompt tokens (a 32K-context
# model's ladder), else the ladder up to where the budget ends. ~130K tokens of prefill: seconds on a
# GPU; the test suite's tiny model at max_model_len 512 needs ~2K tokens, about 1 s on 2 CPU cores.
DEFAULT_BUDGET_TOKENS = 131_072

NEEDLE_WORDS = ("marigold", "tangerine", "blueprint", "lighthouse", "cinnamon", "harbor")
NEEDLE = "Remember this: the secret code word is {word}."
QUESTION = "\nQuestion: what is the secret code word? Answer: the secret code word is"
NEEDLE_TOKENS = 12
CONTROL_TOKENS = 96
REPLACEMENT = "\ufffd"
# Plain prose without the code word: the filler of both probes, rotated per length.
SEED_TEXT = (
    "The river bends twice before it reaches the old mill, where the water slows and the fish rest. "
    "Farmers bring their grain in autumn, and the miller weighs each sack on a scale of iron and oak. "
    "In winter the wheel stops, the children skate on the pond, and the village keeps its lamps lit late. "
    "Travellers ask for the road to the coast; the answer is always the same: follow the river south. "
)


@dataclass(frozen=True)
class ProbeOptions:
    model: str
    max_model_len: int
    dtype: str = DEFAULT_DTYPE
    # Lengths where a kernel changes its way of working: the server's chunked-prefill size
    # (--max-num-batched-tokens), the model's sliding window. Each is checked at b and b+1.
    boundaries: tuple[int, ...] = ()
    budget_tokens: int | None = DEFAULT_BUDGET_TOKENS
    needle: bool = True

    @property
    def tolerance(self) -> float:
        return TOLERANCE_NATS[self.dtype]


class CannotJudge(Exception):
    """The server lacks what a probe needs (token ids, prompt log-probabilities); says which."""


@dataclass
class Cost:
    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0


@dataclass
class Check:
    """One consistency check at one length (the prefill path's context, prompt plus generated)."""

    length: int
    verdict: str  # consistent, inconsistent, undecided (every position a near-tie)
    decisive: int = 0
    ties: int = 0
    max_logprob_gap: float = 0.0
    mismatch: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "length": self.length,
            "verdict": self.verdict,
            "decisive_positions": self.decisive,
            "near_ties": self.ties,
            "max_logprob_gap": round(self.max_logprob_gap, 4),
            "mismatch": self.mismatch,
        }


@dataclass
class NeedleCheck:
    length: int
    found: bool
    answer: str
    degenerate: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "length": self.length,
            "found": self.found,
            "answer": self.answer[:80],
            "degenerate": self.degenerate,
        }


@dataclass
class Ladder:
    """One probe's climb: the checks in the order run, the verdict and what stopped it early."""

    checks: list[Any] = field(default_factory=list)
    longest_ok: int | None = None
    first_failing: int | None = None
    stopped: str | None = None


def ladder(max_model_len: int, boundaries: Iterable[int] = ()) -> list[int]:
    """Context lengths to check, ascending, each at most max_model_len - 1 (the prefill path asks
    one more token): powers of two from SHORTEST, each boundary and the token past it, the limit."""
    limit = max_model_len - 1
    lengths = {limit}
    power = SHORTEST
    while power < limit:
        lengths.add(power)
        power *= 2
    for boundary in boundaries:
        lengths |= {boundary, boundary + 1}
    return sorted(n for n in lengths if GENERATED + 2 <= n <= limit)


def degenerate(text: str, token_ids: list[int]) -> str | None:
    """Why an answer is degenerate (what a broken kernel emits), or None."""
    if not text.strip():
        return "empty text"
    if text.count(REPLACEMENT) * 2 >= len(text):
        return f"{text.count(REPLACEMENT)} of {len(text)} characters are U+FFFD (bytes that are not text)"
    if len(token_ids) >= 4 and len(set(token_ids)) == 1:
        return f"one token ({token_ids[0]}) repeated {len(token_ids)} times"
    return None


class Probe:
    def __init__(self, client: oc.Client, options: ProbeOptions, seed_ids: list[int]) -> None:
        self.client = client
        self.options = options
        self.seed_ids = seed_ids
        self.cost = Cost()
        self._needles: dict[str, tuple[list[int], list[int]]] = {}

    def _afford(self, prompt_tokens: int) -> bool:
        budget = self.options.budget_tokens
        return budget is None or self.cost.prompt_tokens + prompt_tokens <= budget

    def _time_left(self) -> bool:
        deadline = self.client.server.deadline
        return deadline is None or time.monotonic() < deadline - 1.0

    async def _complete(self, body: dict[str, Any]) -> schema.ProbeAnswer:
        started = time.perf_counter()
        try:
            answer = await self.client.probe_completion(body)
        except oc.ServerError as exc:
            if exc.kind == oc.HTTP and exc.status == 400:
                raise CannotJudge(f"the server refuses the probe's request ({exc})") from None
            raise
        finally:
            self.cost.seconds += time.perf_counter() - started
        self.cost.requests += 1
        self.cost.prompt_tokens += len(body["prompt"]) if isinstance(body["prompt"], list) else 0
        self.cost.generated_tokens += len(answer.token_ids)
        return answer

    def _prompt(self, length: int) -> list[int]:
        # Rotated by the length: no two checks share a first block, so vLLM's prefix cache never
        # hands one check the KV another computed.
        n = len(self.seed_ids)
        return [self.seed_ids[(length + i) % n] for i in range(length)]

    async def consistency_at(self, length: int) -> Check:
        """Decode k tokens after length-k prompt tokens, then score all of them in one prefill."""
        tolerance = self.options.tolerance
        prompt = self._prompt(length - GENERATED)
        decoded = await self._complete(
            {
                "model": self.options.model,
                "prompt": prompt,
                "max_tokens": GENERATED,
                "temperature": 0,
                "ignore_eos": True,
                "logprobs": 2,
                "return_token_ids": True,
            }
        )
        if len(decoded.token_ids) != GENERATED:
            raise CannotJudge(
                f"/v1/completions returned {len(decoded.token_ids)} token ids for {GENERATED} tokens "
                "(the server does not honour return_token_ids)"
            )
        scored = await self._complete(
            {
                "model": self.options.model,
                "prompt": prompt + decoded.token_ids,
                "max_tokens": 1,
                "temperature": 0,
                "prompt_logprobs": 2,
            }
        )
        positions = scored.prompt_logprobs[len(prompt) :]
        if len(positions) != GENERATED or any(p is None for p in positions):
            raise CannotJudge(
                "/v1/completions returned no prompt_logprobs (the server does not support them)"
            )
        check = Check(length, "undecided")
        for j, (token, ranked) in enumerate(zip(decoded.token_ids, positions, strict=True)):
            assert ranked is not None
            best = max(ranked.values(), key=lambda e: e.logprob)
            mine = ranked.get(token)
            rank_gap = best.logprob - mine.logprob if mine is not None else math.inf
            others = [e.logprob for t, e in ranked.items() if t != token]
            lead = mine.logprob - max(others, default=-math.inf) if mine is not None else -math.inf
            decode_margin = decoded.margins[j] if j < len(decoded.margins) else math.inf
            decoded_logprob = decoded.logprobs[j] if j < len(decoded.logprobs) else None
            path_gap = (
                abs(mine.logprob - decoded_logprob)
                if mine is not None and decoded_logprob is not None
                else 0.0
            )
            check.max_logprob_gap = max(check.max_logprob_gap, path_gap)
            if rank_gap > tolerance and decode_margin > tolerance:
                why = "the prefill path ranks another token first"
            elif path_gap > LOGPROB_FACTOR * tolerance:
                why = f"the two paths give it log-probabilities {path_gap:.3f} nats apart"
            else:
                # a near-tie on either path may break either way: it decides nothing
                if lead > tolerance and decode_margin > tolerance:
                    check.decisive += 1
                else:
                    check.ties += 1
                continue
            check.verdict = "inconsistent"
            check.mismatch = {
                "position": len(prompt) + j,
                "why": why,
                "decoded_token": token,
                "prefill_top_token": max(ranked, key=lambda t: ranked[t].logprob),
                "prefill_top_logprob": round(best.logprob, 4),
                "decoded_token_prefill_logprob": None if mine is None else round(mine.logprob, 4),
                "decoded_token_decode_logprob": decoded_logprob,
                "tolerance_nats": tolerance,
            }
            return check
        if check.decisive:
            check.verdict = "consistent"
        return check

    async def needle_at(self, length: int, word: str) -> NeedleCheck:
        """The code word, filler, the question: `length` tokens with the answer's."""
        model = self.options.model
        if word not in self._needles:  # tokenized once per run, not once per length
            self._needles[word] = (
                await self.client.tokenize({"model": model, "prompt": NEEDLE.format(word=word)}),
                await self.client.tokenize({"model": model, "prompt": QUESTION, "add_special_tokens": False}),
            )
        needle, question = self._needles[word]
        filler = length - NEEDLE_TOKENS - len(needle) - len(question)
        if filler < 0:
            raise CannotJudge(f"a needle prompt needs more than {length} tokens")
        answer = await self._complete(
            {
                "model": model,
                "prompt": needle + self._prompt(filler) + question,
                "max_tokens": NEEDLE_TOKENS,
                "temperature": 0,
            }
        )
        found = word in answer.text.lower()
        return NeedleCheck(length, found, answer.text, degenerate(answer.text, answer.token_ids))


def _verdict_ok(point: Any) -> bool | None:
    """One rung's verdict (a consistency Check or a NeedleCheck): True, False, or None when undecided."""
    if isinstance(point, Check):
        return {"consistent": True, "inconsistent": False}.get(point.verdict)
    return point.found and point.degenerate is None


async def climb(probe: Probe, lengths: list[int], run_one: Any) -> Ladder:
    """Run `run_one(length)` up the ladder; at the first failure bisect the gap below it."""
    result = Ladder()
    try:
        return await _climb(probe, lengths, run_one, result)
    except oc.ServerError as exc:
        if exc.kind != oc.TIMEOUT or probe._time_left():
            raise  # the server stalled: smoke's explanation of a failed request applies
        # the run's own deadline cut the check short: what was checked stands, the rest is unknown
        result.stopped = f"the deadline came during a check ({exc})"
        return result


async def _climb(probe: Probe, lengths: list[int], run_one: Any, result: Ladder) -> Ladder:
    lower = 0
    for length in lengths:
        if not probe._time_left():
            result.stopped = f"the deadline came before length {length}"
            break
        if not probe._afford(2 * length):
            result.stopped = (
                f"the budget of {probe.options.budget_tokens} prompt tokens ends before length {length}"
            )
            break
        check = await run_one(length)
        result.checks.append(check)
        ok = _verdict_ok(check)
        if ok is False:
            result.first_failing = length
            break
        if ok:
            result.longest_ok = length
            lower = length
    if result.first_failing is None:
        return result
    high = result.first_failing
    while high - lower > 1 and probe._time_left() and probe._afford(2 * high):
        middle = (lower + high) // 2
        if middle < GENERATED + 2:
            break
        check = await run_one(middle)
        result.checks.append(check)
        ok = _verdict_ok(check)
        if ok is False:
            high = middle
        else:
            lower = middle  # an undecided length counts as passed: it showed no failure
            if ok:
                result.longest_ok = max(result.longest_ok or 0, middle)
    result.first_failing = high
    if high - lower > 1:
        result.stopped = (
            result.stopped or f"bisection stopped between {lower} and {high} (budget or deadline)"
        )
    return result


async def seed_ids(client: oc.Client, model: str) -> list[int]:
    """The filler's token ids, as the server's own tokenizer makes them (no BOS: they are spliced)."""
    try:
        ids = await client.tokenize({"model": model, "prompt": SEED_TEXT, "add_special_tokens": False})
    except oc.ServerError as exc:
        if exc.kind in (oc.HTTP, oc.BAD_RESPONSE):
            raise CannotJudge(
                f"the server offers no /tokenize to build prompts of exact lengths ({exc})"
            ) from None
        raise
    if len(ids) < 2:
        raise CannotJudge("/tokenize returned fewer than two tokens for the filler text")
    return ids


async def run_probe(client: oc.Client, options: ProbeOptions) -> dict[str, Any]:
    """Both probes up the ladder; the JSON-ready evidence. ServerError propagates (the caller's
    explanation of a failed request applies); what the server cannot do is a cannot_judge verdict."""
    try:
        ids = await seed_ids(client, options.model)
    except CannotJudge as exc:
        why = str(exc)
        return {
            "max_model_len": options.max_model_len,
            "consistency": {"verdict": "cannot_judge", "why": why},
            "needle": {"verdict": "cannot_judge", "why": why},
        }
    probe = Probe(client, options, ids)
    lengths = ladder(options.max_model_len, options.boundaries)
    report: dict[str, Any] = {
        "max_model_len": options.max_model_len,
        "dtype": options.dtype,
        "tolerance_nats": options.tolerance,
        "generated_per_check": GENERATED,
        "budget_tokens": options.budget_tokens,
        "ladder": lengths,
    }
    try:
        consistency = await climb(probe, lengths, probe.consistency_at)
    except CannotJudge as exc:
        report["consistency"] = {"verdict": "cannot_judge", "why": str(exc)}
    else:
        decided = [c for c in consistency.checks if c.verdict != "undecided"]
        verdict = (
            "inconsistent"
            if consistency.first_failing is not None
            else "consistent"
            if decided
            else "cannot_judge"
        )
        report["consistency"] = {
            "verdict": verdict,
            "why": None if decided else _undecided_why(consistency),
            "longest_consistent": consistency.longest_ok,
            "first_inconsistent": consistency.first_failing,
            "stopped": consistency.stopped,
            "checks": [c.as_dict() for c in consistency.checks],
        }
    if options.needle:
        report["needle"] = await _needle(probe, lengths)
    report["cost"] = {
        "requests": probe.cost.requests,
        "prompt_tokens": probe.cost.prompt_tokens,
        "generated_tokens": probe.cost.generated_tokens,
        "seconds": round(probe.cost.seconds, 3),
    }
    return report


def _undecided_why(consistency: Ladder) -> str:
    if not consistency.checks:
        return f"no length was checked: {consistency.stopped}"
    return "every generated token was a near-tie on both paths (flat logits): nothing to compare"


async def _needle(probe: Probe, lengths: list[int]) -> dict[str, Any]:
    word = NEEDLE_WORDS[probe.options.max_model_len % len(NEEDLE_WORDS)]
    try:
        control = await probe.needle_at(min(CONTROL_TOKENS, probe.options.max_model_len - 1), word)
        if control.degenerate:
            return {
                "verdict": "degenerate",
                "why": f"the answer to a short prompt is degenerate: {control.degenerate}",
                "control": control.as_dict(),
                "checks": [],
            }
        if not control.found:
            return {
                "verdict": "cannot_judge",
                "why": "the model does not find the code word even in a short prompt: cannot judge with "
                "this model (not a server failure)",
                "control": control.as_dict(),
                "checks": [],
            }

        async def at(length: int) -> NeedleCheck:
            return await probe.needle_at(length, word)

        climbed = await climb(probe, [n for n in lengths if n > CONTROL_TOKENS], at)
    except CannotJudge as exc:
        return {"verdict": "cannot_judge", "why": str(exc), "checks": []}
    failing = next((c for c in climbed.checks if c.length == climbed.first_failing), None)
    verdict = "found"
    if failing is not None:
        verdict = "degenerate" if failing.degenerate else "wrong"
    return {
        "verdict": verdict,
        "why": None,
        "control": control.as_dict(),
        "longest_found": climbed.longest_ok,
        "first_wrong": climbed.first_failing,
        "stopped": climbed.stopped,
        "checks": [c.as_dict() for c in climbed.checks],
    }
