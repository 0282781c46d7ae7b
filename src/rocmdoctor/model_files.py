"""A model's config.json and safetensors headers, read from a local directory or the Hugging Face
cache, never the weights.

A safetensors file starts with an 8-byte little-endian header length N and N bytes of JSON that
map each tensor to its dtype, shape and `data_offsets`; the weights follow. We read those 8 + N
bytes only, with N capped the way the safetensors library caps it (100 MB).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

# safetensors' own limit on the header (safetensors/src/tensor.rs MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000
MAX_CONFIG_BYTES = 4 << 20
MAX_INDEX_BYTES = 64 << 20
CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class ModelFilesError(ValueError):
    """The model's files are missing or malformed; the message says which and what to do."""


def looks_like_hub_id(model: str) -> bool:
    return bool(_HF_ID.match(model)) and ".." not in model


def header_length(first8: bytes, source: str) -> int:
    if len(first8) < 8:
        raise ModelFilesError(f"{source}: shorter than 8 bytes, not a safetensors file")
    (length,) = struct.unpack("<Q", first8[:8])
    if length == 0 or length > MAX_HEADER_BYTES:
        raise ModelFilesError(
            f"{source}: header length {length} is not in 1..{MAX_HEADER_BYTES}; "
            "not a safetensors file (or a corrupt one)"
        )
    return length


def json_object(data: bytes, what: str, not_json: str = "is not valid JSON") -> dict:
    """`data` as a JSON object, or ModelFilesError: "{what} {not_json} (why)" / "{what} is not a JSON object"."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFilesError(f"{what} {not_json} ({exc})") from None
    if not isinstance(value, dict):
        raise ModelFilesError(f"{what} is not a JSON object")
    return value


def parse_header(blob: bytes, source: str) -> dict:
    return json_object(blob, f"{source}: the safetensors header", not_json="is not JSON")


def _read_exact(stream: BinaryIO, n: int, source: str) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise ModelFilesError(f"{source}: truncated (wanted {n} bytes, got {len(data)})")
    return data


def read_header(path: Path) -> dict:
    """The JSON header of one local safetensors file: 8 + N bytes read, nothing more."""
    try:
        with open(path, "rb") as stream:
            length = header_length(stream.read(8), str(path))
            return parse_header(_read_exact(stream, length, str(path)), str(path))
    except OSError as exc:
        raise ModelFilesError(f"cannot read {path}: {exc.strerror or exc}") from None


def read_json(path: Path, limit: int) -> dict:
    try:
        with open(path, "rb") as stream:
            data = stream.read(limit + 1)
    except OSError as exc:
        raise ModelFilesError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise ModelFilesError(f"{path} is larger than {limit} bytes; not a model config")
    return json_object(data, str(path))


def shard_names(index: dict, source: str) -> list[str]:
    """The distinct shard files of a model.safetensors.index.json, in order of first use."""
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelFilesError(f"{source}: no weight_map")
    names: list[str] = []
    for name in weight_map.values():
        if (
            not isinstance(name, str)
            or "/" in name
            or name.startswith(".")
            or not name.endswith(".safetensors")
        ):
            raise ModelFilesError(f"{source}: shard name {name!r} is not a plain .safetensors file name")
        if name not in names:
            names.append(name)
    return names


@dataclass
class ModelFiles:
    """What was read: the config and every shard's header, and where from."""

    source: str  # "local directory" | "Hugging Face cache" | "Hugging Face Hub"
    location: str
    config: dict
    headers: list[dict] = field(default_factory=list)
    weights_note: str | None = None  # why the weights' size is unknown, when it is
    bytes_read: int = 0


def read_local(directory: Path, source: str = "local directory") -> ModelFiles:
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise ModelFilesError(
            f"{directory} has no config.json; point --model at a model directory "
            "(the folder holding config.json and *.safetensors) or a Hugging Face id"
        )
    config = read_json(config_path, MAX_CONFIG_BYTES)
    files = ModelFiles(source, str(directory), config)
    index_path = directory / INDEX_FILE
    if index_path.is_file():
        names = shard_names(read_json(index_path, MAX_INDEX_BYTES), str(index_path))
    else:
        names = sorted(p.name for p in directory.glob("*.safetensors"))
    missing = [name for name in names if not (directory / name).is_file()]
    if not names:
        files.weights_note = f"no *.safetensors in {directory}: the weights' size is unknown"
    elif missing:
        files.weights_note = (
            f"{len(missing)} of {len(names)} shards are not in {directory} "
            f"(first: {missing[0]}); an incomplete download? the weights' size is unknown"
        )
    else:
        for name in names:
            header = read_header(directory / name)
            files.headers.append(header)
    return files


def hub_cache_dir(env: Mapping[str, str] = os.environ) -> Path:
    """huggingface_hub's cache: HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HUGGINGFACE_HUB_CACHE"):
        return Path(env["HUGGINGFACE_HUB_CACHE"]).expanduser()
    home = env.get("HF_HOME") or str(
        Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    )
    return Path(home).expanduser() / "hub"


def cached_snapshot(
    model_id: str, revision: str = "main", env: Mapping[str, str] = os.environ
) -> Path | None:
    """The snapshot directory of `model_id` in the local cache, or None when it is not cached."""
    repo = hub_cache_dir(env) / ("models--" + model_id.replace("/", "--"))
    if not repo.is_dir():
        return None
    commit = revision
    ref = repo / "refs" / revision
    if ref.is_file():
        try:
            commit = ref.read_text(encoding="ascii", errors="replace")[:100].strip()
        except OSError:
            return None
    snapshot = repo / "snapshots" / commit
    if (snapshot / CONFIG_FILE).is_file():
        return snapshot
    return None


def local_model(model: str, revision: str = "main", env: Mapping[str, str] = os.environ) -> ModelFiles | None:
    """The model from a local directory or the offline cache; None when only the Hub has it."""
    path = Path(model).expanduser()
    try:
        is_dir = path.is_dir()
    except OSError as exc:  # a name too long for the kernel, a component that denies us
        raise ModelFilesError(f"--model {model[:200]!r}: {exc.strerror or exc}") from None
    if is_dir:
        return read_local(path)
    if looks_like_hub_id(model):
        snapshot = cached_snapshot(model, revision, env)
        if snapshot is not None:
            return read_local(snapshot, "Hugging Face cache")
        return None
    raise ModelFilesError(f"--model {model!r} is neither a directory nor a Hugging Face id (org/name)")


def weights_bytes_offline(
    model: str, revision: str = "main", env: Mapping[str, str] = os.environ
) -> int | None:
    """The exact weights size of a local or cached model from its safetensors headers; None when it is
    not here or its shards are incomplete. No network: for `check --model` (Options.model_bytes)."""
    try:
        files = local_model(model, revision, env)
    except ModelFilesError:
        return None
    if files is None or files.weights_note:
        return None
    total = 0
    for header in files.headers:
        for name, entry in header.items():
            offsets = (
                entry.get("data_offsets") if isinstance(entry, dict) and name != "__metadata__" else None
            )
            if isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets):
                total += max(0, offsets[1] - offsets[0])
    return total
