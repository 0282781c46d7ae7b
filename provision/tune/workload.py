"""What `rocmdoctor tune` sends: the user's workload (JSONL) or a synthetic one, fresh for the prefix cache.

A workload file has one JSON object per line, `{"prompt": "...", "output_tokens": 64}` (blank lines
and lines starting with `#` are skipped). It is a foreign document: bounded in size, line count, prompt
length and output length, each line decoded by `rocmdoctor.documents` into a typed record; the first bad
line is an error that names it.

Every request of every trial is made unique from its first token (a prefix naming the trial and the
request), so vLLM's prefix cache, which matches whole blocks from a prompt's start, never serves one
trial's prefill to another: each setting pays the full prefill, as a new user's prompt does.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from rocmdoctor.documents import DocumentError, decode
from rocmdoctor.provision.verify.bench import SEED_TEXT, unique_prompts

MAX_FILE_BYTES = 64 << 20
MAX_LINES = 100_000
MAX_LINE_BYTES = 1 << 20
MAX_OUTPUT_TOKENS = 1 << 16
DEFAULT_SEED = 0
# Synthetic prompt numbers of trial t start at t * TRIAL_STRIDE: no two requests of a tune alike.
TRIAL_STRIDE = 1 << 20


class WorkloadError(ValueError):
    """A workload file that cannot be used; the message names the line and what to fix."""


class _Line(msgspec.Struct, forbid_unknown_fields=False):
    prompt: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_LINE_BYTES)]
    output_tokens: Annotated[int, msgspec.Meta(ge=1, le=MAX_OUTPUT_TOKENS)]


@dataclass(frozen=True)
class Item:
    prompt: str | None  # None: a synthetic prompt of `prompt_tokens` tokens
    output_tokens: int
    prompt_tokens: int = 0


@dataclass(frozen=True)
class Workload:
    items: tuple[Item, ...]
    source: str  # the file, or "synthetic"
    seed: int = DEFAULT_SEED

    @property
    def synthetic(self) -> bool:
        return self.source == "synthetic"

    def digest(self) -> str:
        """Names the workload in the state file: same items, same seed, same digest."""
        text = msgspec.json.encode(
            [self.seed, [(i.prompt, i.output_tokens, i.prompt_tokens) for i in self.items]]
        )
        return hashlib.sha256(text).hexdigest()[:16]

    def typical_len(self) -> int:
        """The mean prompt + output length in tokens (a text prompt counted at 4 characters a token)."""
        total = sum((i.prompt_tokens or len(i.prompt or "") // 4) + i.output_tokens for i in self.items)
        return max(1, total // len(self.items))

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "requests_in_file": len(self.items),
            "seed": self.seed,
            "digest": self.digest(),
            "typical_len": self.typical_len(),
        }


def parse_jsonl(data: bytes, source: str, seed: int = DEFAULT_SEED) -> Workload:
    """The workload in `data` (the bytes of `source`, read by the caller at most MAX_FILE_BYTES + 1)."""
    if len(data) > MAX_FILE_BYTES:
        raise WorkloadError(f"{source}: larger than {MAX_FILE_BYTES} bytes; split the workload")
    items: list[Item] = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        line = raw.strip()
        if not line or line.startswith(b"#"):
            continue
        if len(items) >= MAX_LINES:
            raise WorkloadError(f"{source}: more than {MAX_LINES} requests; a sample of them tunes as well")
        try:
            record = decode(line, _Line, f"{source} line {number}", MAX_LINE_BYTES + 4096)
        except DocumentError as exc:
            raise WorkloadError(
                f'{exc}; each line must be a JSON object {{"prompt": "<text>", "output_tokens": <1..65536>}}'
            ) from None
        items.append(Item(record.prompt, record.output_tokens))
    if not items:
        raise WorkloadError(
            f'{source}: no requests; write one JSON object per line: {{"prompt": "...", "output_tokens": 64}}'
        )
    return Workload(tuple(items), source, seed)


def synthetic(prompt_tokens: int, output_tokens: int, seed: int = DEFAULT_SEED) -> Workload:
    return Workload((Item(None, output_tokens, prompt_tokens),), "synthetic", seed)


def trial_items(workload: Workload, count: int, trial: int) -> list[Item]:
    """`count` requests for one trial: the workload's items in an order fixed by the seed and the trial."""
    rng = random.Random(f"{workload.seed}:{trial}")
    pool = list(workload.items)
    out: list[Item] = []
    while len(out) < count:
        rng.shuffle(pool)
        out.extend(pool)
    return out[:count]


def request_bodies(
    workload: Workload, model: str, ids: Sequence[int] | None, count: int, trial: int
) -> list[dict[str, Any]]:
    """The completion requests of trial number `trial` (unique across trials: see the module text).

    `ids`: the token ids a synthetic prompt is made of (the server's /tokenize of the seed text), None
    when the server has none (then words)."""
    bodies = []
    items = trial_items(workload, count, trial)
    for index, item in enumerate(items):
        prompt: Any
        if item.prompt is not None:
            prompt = f"[run {trial}.{index}] {item.prompt}"
        elif ids:
            prompt = unique_prompts(list(ids), item.prompt_tokens, trial * TRIAL_STRIDE + index, 1)[0]
        else:
            words = SEED_TEXT.split()
            prompt = " ".join(unique_prompts(words, item.prompt_tokens, trial * TRIAL_STRIDE + index, 1)[0])
        bodies.append(
            {
                "model": model,
                "prompt": prompt,
                "max_tokens": item.output_tokens,
                "ignore_eos": True,
                "temperature": 0,
            }
        )
    return bodies
