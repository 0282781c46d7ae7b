"""What `plan` and `tune` take about a model: its files (a directory, the HF cache or the Hub) and a
memory size as people write it. Not a command: commands import it, so no command imports another."""

from __future__ import annotations

import math
import re

from rocmdoctor.commands.common import UserError

MAX_SIZE = 1 << 50  # 1 PiB per GPU: beyond any device, and far inside a float's exact integers


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)


_UNITS = {
    "": 1,
    "B": 1,
    "K": 1000,
    "KB": 1000,
    "KIB": 1 << 10,
    "KI": 1 << 10,
    "M": 10**6,
    "MB": 10**6,
    "MIB": 1 << 20,
    "MI": 1 << 20,
    "G": 10**9,
    "GB": 10**9,
    "GIB": 1 << 30,
    "GI": 1 << 30,
    "T": 10**12,
    "TB": 10**12,
    "TIB": 1 << 40,
    "TI": 1 << 40,
}


def parse_size(text: str, option: str) -> int:
    """'96GiB', '80GB', '1073741824' -> bytes; a clear error for anything else."""
    match = _SIZE.match(text or "")
    if not match:
        raise UserError(f"{option} {text!r} is not a size: write e.g. 96GiB, 80GB or a number of bytes")
    value = float(match.group(1)) * _UNITS[(match.group(2) or "").upper()]
    if not math.isfinite(value) or value > MAX_SIZE:
        raise UserError(f"{option} {text[:40]!r}... is larger than any GPU (at most 1 PiB): write e.g. 96GiB")
    if value < 1:
        raise UserError(f"{option} must be positive, not {text!r}")
    return int(value)


def load_model_files(model: str, revision: str, offline: bool):
    from rocmdoctor.provision.server.hub import load_model
    from rocmdoctor.vllm.model_files import ModelFilesError

    try:
        return load_model(model, revision, offline=offline)
    except ModelFilesError as exc:
        raise UserError(str(exc)) from None
