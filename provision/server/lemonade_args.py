"""vllm_args as Lemonade reads them: split on spaces, flags with their values, the protected flags, and the
merge rocmdoctor uses to set its flags while keeping every other word (lemonade-sdk/lemonade @
e385039ed33551de7f54cb73194cd08088772c08: src/cpp/server/backends/vllm/vllm_arg_resolver.cpp
`protected_flags()` and `conflict_key()`; docs/guide/configuration/vllm.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from rocmdoctor.provision.server.args import flag_meanings

# Lemonade-managed process arguments, refused in vllm_args (vllm_arg_resolver.cpp protected_flags()).
PROTECTED_FLAGS = (
    "--enable-prefix-caching",
    "--host",
    "--max-model-len",
    "--model",
    "--port",
    "--served-model-name",
)
PROTECTED = frozenset(PROTECTED_FLAGS)
# One conflict key in Lemonade's resolver: the later one replaces the earlier.
MEMORY_BUDGET_FLAGS = ("--gpu-memory-utilization", "--kv-cache-memory-bytes")


class ProtectedFlagError(ValueError):
    """vllm_args would carry a flag Lemonade manages itself."""


# vllm_args are read word by word, split on whitespace (vllm.md, "Speculative decoding": Lemonade splits
# them on spaces), and every word the user wrote is kept byte for byte: a JSON value such as
# `--speculative-config {"method":"ngram","num_speculative_tokens":3}` is never re-split or re-quoted.
def split_args(text: str) -> list[str]:
    return text.split()


def meanings(word: str) -> set[str]:
    """The vLLM flags (long names) vLLM's own parser could read `word` as: vLLM 0.32's argparse takes any
    unique prefix (allow_abbrev, vllm/flags.py), so `--por` is `--port` and `--max-model` is
    `--max-model-len`; underscores count as dashes."""
    return flag_meanings(word)


def flag_name(word: str) -> str | None:
    """`--max_num_seqs=4` and `--max-num` (a unique prefix) -> `--max-num-seqs`; None for a value. A
    word vLLM would find ambiguous keeps its own spelling."""
    found = meanings(word)
    if len(found) == 1:
        return next(iter(found))
    if not word.startswith("--") or re.fullmatch(r"-\d+(\.\d*)?", word):
        return None
    return "--" + word[2:].split("=", 1)[0].replace("_", "-")


def _protected_meanings(word: str) -> set[str]:
    return meanings(word) & PROTECTED


def _conflicts(flag: str) -> tuple[str, ...]:
    return MEMORY_BUDGET_FLAGS if flag in MEMORY_BUDGET_FLAGS else (flag,)


def parse_args(words: list[str]) -> list[tuple[str | None, list[str]]]:
    """Groups of (flag, its words): a flag with its following values; words before any flag have None."""
    groups: list[tuple[str | None, list[str]]] = []
    for word in words:
        name = flag_name(word) if word.startswith("-") else None
        if name is not None or not groups:
            groups.append((name, [word]))
        else:
            groups[-1][1].append(word)
    return groups


def flag_values(text: str) -> dict[str, str]:
    """The last value of every flag in `text` (what vLLM would use)."""
    out: dict[str, str] = {}
    for name, words in parse_args(split_args(text)):
        if name is None:
            continue
        if "=" in words[0]:
            out[name] = words[0].split("=", 1)[1]
        else:
            out[name] = words[1] if len(words) > 1 else ""
    return out


def protected_in(text: str) -> list[str]:
    """Each word of `text` vLLM could read as a protected flag, as written (`--por`, `--served_model`)."""
    return sorted({word.split("=", 1)[0] for word in split_args(text) if _protected_meanings(word)})


def refuse_protected(body: Mapping[str, Any]) -> None:
    """The last guard before a request: no protected flag ever leaves rocmdoctor, in any spelling vLLM
    accepts."""
    args = body.get("vllm_args")
    found = protected_in(args) if isinstance(args, str) else []
    if found:
        raise ProtectedFlagError(
            f"refusing to send {', '.join(found)} in vllm_args: Lemonade manages "
            f"{', '.join(sorted({m for w in found for m in _protected_meanings(w)}))} "
            "(ctx_size sets the context; vLLM reads a unique prefix of a flag as the flag)",
        )


def merge_vllm_args(current: str, wanted: Mapping[str, str]) -> tuple[str, list[str]]:
    """`current` with each wanted flag set (replacing the same flag, any spelling, and the other memory
    budget flag), every unrelated word kept in order and as written, protected flags dropped. Returns the
    text and notes. Unchanged text when `current` already says the same."""
    notes: list[str] = []
    groups = parse_args(split_args(current))
    have = flag_values(current)
    protected = protected_in(current)
    satisfied = all(have.get(flag) == value for flag, value in wanted.items()) and not any(
        other in have for flag in wanted for other in _conflicts(flag) if other != flag
    )
    if satisfied and not protected:
        return current, notes
    replaced = {c for flag in wanted for c in _conflicts(flag)}
    kept: list[str] = []
    for name, words in groups:
        hit = _protected_meanings(words[0])
        if hit:
            notes.append(
                f"dropped {' '.join(words)} from vllm_args: Lemonade refuses it (it manages {', '.join(sorted(hit))})"
            )
            continue
        if name in replaced:
            continue
        kept += words
    for flag, value in wanted.items():
        kept += [flag, value]
    return " ".join(kept), notes
