"""`rocmdoctor tune`'s record of measured points, so a rerun measures only what it does not know.

A point is known for one context: the host (machine id and GPUs), the bundle (its digest), the model
(its revision: the config's digest for a directory), the vLLM arguments other than the ones tuned and
the port, and the workload with the measuring options. Any of these changing is a new context, so an
upgraded bundle or a new model is measured afresh. The document is read bounded and typed like every
foreign document; one that is damaged is reported and replaced, never trusted.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

import msgspec

from rocmdoctor.documents import DocumentError, decode
from rocmdoctor.model import envelope
from rocmdoctor.provision.tune.search import Measurement
from rocmdoctor.provision.tune.writeback import without_tuned

KIND = "rocmdoctor-tune-state"
MAX_STATE_BYTES = 16 << 20
MAX_CONTEXTS = 64
MAX_POINTS = 512


class _Point(msgspec.Struct, forbid_unknown_fields=False):
    max_num_seqs: Annotated[int, msgspec.Meta(ge=1, le=1 << 20)]
    output_tokens_per_s: Annotated[float, msgspec.Meta(ge=0)]
    max_num_batched_tokens: Annotated[int, msgspec.Meta(ge=1, le=1 << 30)] | None = None
    requests: Annotated[int, msgspec.Meta(ge=0)] = 0
    failures: Annotated[int, msgspec.Meta(ge=0)] = 0
    latency_ms: dict[str, dict[str, Annotated[float, msgspec.Meta(ge=0)]]] = {}
    seconds: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    error: Annotated[str, msgspec.Meta(max_length=2000)] = ""


class _Entry(msgspec.Struct, forbid_unknown_fields=False):
    context: dict[str, Any]
    points: Annotated[list[_Point], msgspec.Meta(max_length=MAX_POINTS)]


class _State(msgspec.Struct, forbid_unknown_fields=False):
    schema_version: int
    kind: str
    entries: Annotated[dict[str, _Entry], msgspec.Meta(max_length=MAX_CONTEXTS)]


def stable_argv(argv: list[str]) -> list[str]:
    """The server's arguments without those that change nothing measured (the port) or that tune sets."""
    out: list[str] = []
    words = iter(without_tuned(argv))
    for word in words:
        if word == "--port":
            next(words, None)
        elif not word.startswith("--port="):
            out.append(word)
    return out


def context_key(context: dict[str, Any]) -> str:
    return hashlib.sha256(msgspec.json.encode(context, order="sorted")).hexdigest()[:32]


class State:
    def __init__(self, entries: dict[str, dict[str, Any]] | None = None, problem: str = "") -> None:
        self.entries: dict[str, dict[str, Any]] = entries or {}
        self.problem = problem  # why an existing file was not used ("" when it was, or none existed)

    @classmethod
    def parse(cls, data: bytes | None, source: str) -> State:
        """The state in `data` (None: no file yet). A damaged or foreign file gives an empty state
        with `problem` saying why (the next write replaces it)."""
        if data is None:
            return cls()
        try:
            doc = decode(data, _State, source, MAX_STATE_BYTES)
        except DocumentError as exc:
            return cls(problem=f"{exc}; it is replaced by this run's results")
        if doc.kind != KIND:
            return cls(problem=f"{source}: not a tune state file (kind {doc.kind[:40]!r}); it is replaced")
        entries = {
            key: {"context": entry.context, "points": [msgspec.to_builtins(p) for p in entry.points]}
            for key, entry in doc.entries.items()
        }
        return cls(entries)

    def known(self, context: dict[str, Any]) -> list[Measurement]:
        entry = self.entries.get(context_key(context))
        if entry is None or entry["context"] != context:
            return []
        return [Measurement.from_json(p) for p in entry["points"]]

    def add(self, context: dict[str, Any], points: list[Measurement]) -> None:
        key = context_key(context)
        entry = self.entries.pop(key, None)
        old = entry["points"] if entry and entry["context"] == context else []
        fresh = [p.to_json() for p in points if not p.error]  # a failed start may be transient
        settings = {(p["max_num_seqs"], p["max_num_batched_tokens"]) for p in fresh}
        kept = [p for p in old if (p["max_num_seqs"], p.get("max_num_batched_tokens")) not in settings]
        # The newest context last: the oldest are dropped past MAX_CONTEXTS.
        self.entries[key] = {"context": context, "points": (kept + fresh)[-MAX_POINTS:]}
        while len(self.entries) > MAX_CONTEXTS:
            self.entries.pop(next(iter(self.entries)))

    def to_bytes(self) -> bytes:
        doc = envelope(kind=KIND, entries=self.entries)
        return msgspec.json.format(msgspec.json.encode(doc), indent=1) + b"\n"
