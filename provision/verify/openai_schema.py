"""The shapes of vLLM's OpenAI-compatible answers, checked in one place, and what each may weigh.

Every answer `smoke`, `bench` and the readiness test read goes through one function here. A value of
the wrong type, a missing field or an implausible number is a `ShapeError` that names the endpoint
and the field (`/v1/completions: choices[0].text is a number, not a string`), so a server that
answers something else than the OpenAI API is a finding, never a crash further down.

The byte limits are what a legitimate answer can weigh, with a wide margin: anything beyond is a
server (or proxy) that streams without end, and reading on would only grow memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

KIB = 1024
MIB = 1024 * KIB
# GET bodies: /health is empty, /version a few bytes, /v1/models one entry per served model,
# /metrics a few hundred kB even with every histogram bucket of a multi-model server.
HEALTH_BYTES = 64 * KIB
VERSION_BYTES = 64 * KIB
MODELS_BYTES = 4 * MIB
METRICS_BYTES = 16 * MIB
TOKENIZE_BYTES = 4 * MIB
ERROR_BYTES = 64 * KIB
# One SSE line carries one chunk: a few tokens plus ids; vLLM never sends more than a few kB.
SSE_LINE_BYTES = 256 * KIB
# A token is at most a few dozen bytes of text, JSON-escaped up to 6x; the margin is per token.
_BASE_BYTES = 1 * MIB
_PER_TOKEN_BYTES = 4 * KIB
_PER_STREAMED_TOKEN_BYTES = 16 * KIB


def completion_bytes(max_tokens: int) -> int:
    return _BASE_BYTES + max(max_tokens, 1) * _PER_TOKEN_BYTES


def stream_bytes(max_tokens: int) -> int:
    return _BASE_BYTES + max(max_tokens, 1) * _PER_STREAMED_TOKEN_BYTES


def stream_chunks(max_tokens: int) -> int:
    """Chunks with choices a stream may carry: one per token, a chat's role chunk, a finish chunk."""
    return max(max_tokens, 1) + 2


class ShapeError(ValueError):
    """An answer that is not what the endpoint's API defines; the message names endpoint and field."""

    def __init__(self, endpoint: str, field: str, problem: str) -> None:
        super().__init__(f"{endpoint}: {field} {problem}" if field else f"{endpoint}: {problem}")
        self.endpoint = endpoint
        self.field = field


_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}


def kind_of(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return _TYPE_NAMES[type(value)]
    if isinstance(value, (int, float)):
        return "a number"
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _object(endpoint: str, field: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ShapeError(endpoint, field or "the answer", f"is {kind_of(value)}, not an object")
    return value


def _list(endpoint: str, field: str, value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ShapeError(endpoint, field, f"is {kind_of(value)}, not a list")
    return value


def _optional_text(endpoint: str, field: str, value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ShapeError(endpoint, field, f"is {kind_of(value)}, not a string")
    return value


def _count(endpoint: str, field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ShapeError(endpoint, field, f"is {kind_of(value)}, not a whole number")
    if value < 0:
        raise ShapeError(endpoint, field, f"is negative ({value})")
    return value


@dataclass(frozen=True)
class Usage:
    completion_tokens: int
    prompt_tokens: int | None = None


def usage(endpoint: str, value: Any, where: str = "") -> Usage | None:
    """None when the answer carries no usage; a usage of the wrong shape is an error."""
    if value is None:
        return None
    document = _object(endpoint, f"usage{where}", value)
    prompt = document.get("prompt_tokens")
    completion_tokens = document.get("completion_tokens")
    return Usage(
        completion_tokens=_count(endpoint, f"usage.completion_tokens{where}", completion_tokens),
        prompt_tokens=None if prompt is None else _count(endpoint, f"usage.prompt_tokens{where}", prompt),
    )


def within_max_tokens(endpoint: str, tokens: int, max_tokens: int | None) -> int:
    if max_tokens is not None and tokens > max_tokens:
        raise ShapeError(
            endpoint,
            "usage.completion_tokens",
            f"is {tokens}, more than the max_tokens {max_tokens} asked for",
        )
    return tokens


def models(endpoint: str, document: Any) -> list[str]:
    """The ids /v1/models lists."""
    data = _list(endpoint, "data", _object(endpoint, "", document).get("data"))
    ids = []
    for i, entry in enumerate(data):
        model_id = _object(endpoint, f"data[{i}]", entry).get("id")
        if not isinstance(model_id, str) or not model_id:
            raise ShapeError(endpoint, f"data[{i}].id", f"is {kind_of(model_id)}, not a model name")
        ids.append(model_id)
    return ids


def max_model_len(endpoint: str, document: Any, model: str) -> int | None:
    """vLLM's `max_model_len` of the served model in /v1/models; None when the server leaves it out."""
    for i, entry in enumerate(_list(endpoint, "data", _object(endpoint, "", document).get("data"))):
        card = _object(endpoint, f"data[{i}]", entry)
        if card.get("id") == model and card.get("max_model_len") is not None:
            length = _count(endpoint, f"data[{i}].max_model_len", card["max_model_len"])
            return length or None
    return None


@dataclass(frozen=True)
class Completion:
    text: str
    usage: Usage | None


def _first_choice(endpoint: str, document: Any) -> dict[str, Any]:
    choices = _list(endpoint, "choices", _object(endpoint, "", document).get("choices"))
    if not choices:
        raise ShapeError(endpoint, "choices", "is empty")
    return _object(endpoint, "choices[0]", choices[0])


def completion(endpoint: str, document: Any, chat: bool, max_tokens: int | None = None) -> Completion:
    """A non-streamed text or chat completion: the first choice's text and the usage."""
    choice = _first_choice(endpoint, document)
    if chat:
        message = _object(endpoint, "choices[0].message", choice.get("message"))
        text = _optional_text(endpoint, "choices[0].message.content", message.get("content"))
    else:
        text = _optional_text(endpoint, "choices[0].text", choice.get("text"))
    counted = usage(endpoint, document.get("usage"))
    if counted is not None:
        within_max_tokens(endpoint, counted.completion_tokens, max_tokens)
    return Completion(text, counted)


@dataclass(frozen=True)
class StreamEvent:
    has_choices: bool
    text: str
    usage: Usage | None
    error: str | None = None


def stream_event(endpoint: str, document: Any, chat: bool) -> StreamEvent:
    """One `data:` event of a completion stream (text or chat chunk, the usage chunk, an error)."""
    event = _object(endpoint, "a stream event", document)
    choices = event.get("choices")
    if "error" in event and not choices:
        error = event["error"]
        message = error.get("message", error) if isinstance(error, dict) else error
        return StreamEvent(False, "", None, str(message)[:300])
    choices = [] if choices is None else _list(endpoint, "choices of a stream event", choices)
    text = ""
    if choices:
        choice = _object(endpoint, "choices[0] of a stream event", choices[0])
        if chat:
            delta = _object(endpoint, "choices[0].delta of a stream event", choice.get("delta"))
            text = _optional_text(
                endpoint, "choices[0].delta.content of a stream event", delta.get("content")
            )
        else:
            text = _optional_text(endpoint, "choices[0].text of a stream event", choice.get("text"))
    return StreamEvent(bool(choices), text, usage(endpoint, event.get("usage"), " of a stream event"))


def tokenize(endpoint: str, document: Any) -> list[int]:
    tokens = _list(endpoint, "tokens", _object(endpoint, "", document).get("tokens"))
    return [_count(endpoint, f"tokens[{i}]", token) for i, token in enumerate(tokens)]


def version(endpoint: str, document: Any) -> str | None:
    value = _object(endpoint, "", document).get("version")
    if value is None:
        return None
    return _optional_text(endpoint, "version", value) or None


def counter_value(endpoint: str, name: str, value: float | None) -> float | None:
    """A Prometheus counter: finite and not negative, or the server's accounting cannot be read."""
    if value is not None and (not math.isfinite(value) or value < 0):
        raise ShapeError(endpoint, name, f"is {value}, not a count")
    return value


# A prompt_logprobs answer: per prompt token up to top-n + the token itself, ~100 bytes each.
_PER_PROMPT_LOGPROB_BYTES = 512


def probe_bytes(prompt_tokens: int, max_tokens: int) -> int:
    return completion_bytes(max_tokens) + prompt_tokens * _PER_PROMPT_LOGPROB_BYTES


@dataclass(frozen=True)
class Ranked:
    logprob: float
    rank: int | None


@dataclass(frozen=True)
class ProbeAnswer:
    """A completion with its token ids and log-probabilities (vLLM's `return_token_ids`,
    `logprobs` with `return_tokens_as_token_ids`, `prompt_logprobs`)."""

    text: str
    token_ids: list[int]
    # per generated token: its log-probability, and its lead over the runner-up on the decode path
    logprobs: list[float | None]
    margins: list[float]
    # per prompt token: None for the first, else {token id: Ranked}
    prompt_logprobs: list[dict[int, Ranked] | None]


def _logprob(endpoint: str, field: str, value: Any) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value > 0
    ):
        # -inf is sent as a large negative number by vLLM; NaN or a positive value is not a log-probability
        raise ShapeError(endpoint, field, f"is {value!r}, not a log-probability")
    return float(value)


def _token_key(endpoint: str, field: str, key: str) -> int:
    text = key.removeprefix("token_id:")
    if not text.isdigit():
        raise ShapeError(endpoint, field, f"has the key {key[:40]!r}, not a token id")
    return int(text)


def _decode_logprobs(endpoint: str, logprobs: Any, count: int) -> tuple[list[float | None], list[float]]:
    if logprobs is None:
        return [None] * count, [math.inf] * count
    document = _object(endpoint, "choices[0].logprobs", logprobs)
    values = _list(endpoint, "choices[0].logprobs.token_logprobs", document.get("token_logprobs"))
    tops = _list(endpoint, "choices[0].logprobs.top_logprobs", document.get("top_logprobs") or [])
    own = [None if v is None else _logprob(endpoint, f"token_logprobs[{i}]", v) for i, v in enumerate(values)]
    margins = []
    for i, top in enumerate(tops):
        field = f"choices[0].logprobs.top_logprobs[{i}]"
        ranked = sorted(
            (_logprob(endpoint, field, v) for v in _object(endpoint, field, top).values()), reverse=True
        )
        margins.append(ranked[0] - ranked[1] if len(ranked) > 1 else math.inf)
    return own, margins


def probe_answer(endpoint: str, document: Any, max_tokens: int) -> ProbeAnswer:
    """A completion asked with token ids and log-probabilities, each field checked."""
    choice = _first_choice(endpoint, document)
    text = _optional_text(endpoint, "choices[0].text", choice.get("text"))
    raw_ids = choice.get("token_ids") or []
    token_ids = [
        _count(endpoint, f"choices[0].token_ids[{i}]", t)
        for i, t in enumerate(_list(endpoint, "choices[0].token_ids", raw_ids))
    ]
    if len(token_ids) > max_tokens:
        raise ShapeError(
            endpoint,
            "choices[0].token_ids",
            f"holds {len(token_ids)} tokens, more than max_tokens {max_tokens}",
        )
    own, margins = _decode_logprobs(endpoint, choice.get("logprobs"), len(token_ids))
    prompt: list[dict[int, Ranked] | None] = []
    for i, position in enumerate(
        _list(endpoint, "choices[0].prompt_logprobs", choice.get("prompt_logprobs") or [])
    ):
        if position is None:
            prompt.append(None)
            continue
        field = f"choices[0].prompt_logprobs[{i}]"
        entries: dict[int, Ranked] = {}
        for key, entry in _object(endpoint, field, position).items():
            entry = _object(endpoint, f"{field}[{key[:40]!r}]", entry)
            rank = entry.get("rank")
            entries[_token_key(endpoint, field, key)] = Ranked(
                _logprob(endpoint, f"{field}.logprob", entry.get("logprob")),
                None if rank is None else _count(endpoint, f"{field}.rank", rank),
            )
        prompt.append(entries)
    return ProbeAnswer(text, token_ids, own, margins, prompt)
