"""vllm_args as Lemonade reads them: split on spaces, flags with their values, the protected flags, and the
merge rocmdoctor uses to set its flags while keeping every other word (lemonade-sdk/lemonade @
e385039ed33551de7f54cb73194cd08088772c08: src/cpp/server/backends/vllm/vllm_arg_resolver.cpp
`protected_flags()` and `conflict_key()`; docs/guide/configuration/vllm.md)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

# Lemonade-managed process arguments, refused in vllm_args (vllm_arg_resolver.cpp protected_flags()).
PROTECTED_FLAGS = (
    "--enable-prefix-caching",
    "--host",
    "--max-model-len",
    "--model",
    "--port",
    "--served-model-name",
)
# One conflict key in Lemonade's resolver: the later one replaces the earlier.
MEMORY_BUDGET_FLAGS = ("--gpu-memory-utilization", "--kv-cache-memory-bytes")


class ProtectedFlagError(ValueError):
    """vllm_args would carry a flag Lemonade manages itself."""


# vllm_args: Lemonade splits them on spaces (vllm.md, "Speculative decoding"); shlex keeps a quoted value.
def split_args(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def flag_name(word: str) -> str | None:
    """`--max_num_seqs=4` -> `--max-num-seqs`; None for a value."""
    if not word.startswith("--") or re.fullmatch(r"-\d+(\.\d*)?", word):
        return None
    return "--" + word[2:].split("=", 1)[0].replace("_", "-")


def _conflicts(flag: str) -> tuple[str, ...]:
    return MEMORY_BUDGET_FLAGS if flag in MEMORY_BUDGET_FLAGS else (flag,)


def parse_args(words: list[str]) -> list[tuple[str | None, list[str]]]:
    """Groups of (flag, its words): a flag with its following values; words before any flag have None."""
    groups: list[tuple[str | None, list[str]]] = []
    for word in words:
        name = flag_name(word)
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
    return sorted({n for n, _ in parse_args(split_args(text)) if n in PROTECTED_FLAGS})


def refuse_protected(body: Mapping[str, Any]) -> None:
    """The last guard before a request: no protected flag ever leaves rocmdoctor."""
    args = body.get("vllm_args")
    found = protected_in(args) if isinstance(args, str) else []
    if found:
        raise ProtectedFlagError(
            f"refusing to send {', '.join(found)} in vllm_args: Lemonade manages them (ctx_size sets the context)",
        )


def merge_vllm_args(current: str, wanted: Mapping[str, str]) -> tuple[str, list[str]]:
    """`current` with each wanted flag set (replacing the same flag, any spelling, and the other memory
    budget flag), every unrelated word kept in order, protected flags dropped. Returns the text and notes.
    Unchanged text when `current` already says the same."""
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
        if name in PROTECTED_FLAGS:
            notes.append(f"dropped {' '.join(words)} from vllm_args: Lemonade refuses it (it manages {name})")
            continue
        if name in replaced:
            continue
        kept += words
    for flag, value in wanted.items():
        kept += [flag, value]
    return " ".join(shlex.quote(w) for w in kept), notes
