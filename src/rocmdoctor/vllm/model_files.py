"""A model's config.json and safetensors headers, read from a local directory or the Hugging Face
cache, never the weights.

A safetensors file starts with an 8-byte little-endian header length N and N bytes of JSON that
map each tensor to its dtype, shape and `data_offsets`; the weights follow. We read those 8 + N
bytes only, with N capped the way the safetensors library caps it (100 MB).
"""

from __future__ import annotations

import os
import re
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, BinaryIO

import msgspec
from msgspec import Meta

from rocmdoctor import documents
from rocmdoctor.rootfs import read_regular

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
    return bool(_HF_ID.fullmatch(model)) and ".." not in model


def header_length(first8: bytes, source: str) -> int:
    """The header length N of a safetensors file, from its first 8 bytes, bounded before anything is read."""
    if len(first8) < 8:
        raise ModelFilesError(f"{source}: shorter than 8 bytes, not a safetensors file")
    (length,) = struct.unpack("<Q", first8[:8])
    if length < 2 or length > MAX_HEADER_BYTES:
        raise ModelFilesError(
            f"{source}: header length {length} is not in 2..{MAX_HEADER_BYTES}; "
            "not a safetensors file (or a corrupt one)"
        )
    return length


# -- the typed records: every number that drives arithmetic or allocation carries its range ----------

# Ranges far beyond any published model, small enough that no loop or list they size can hurt.
Layers = Annotated[int, Meta(ge=1, le=4096)]
Heads = Annotated[int, Meta(ge=1, le=16384)]
Dim = Annotated[int, Meta(ge=1, le=1 << 20)]
SmallDim = Annotated[int, Meta(ge=1, le=1 << 16)]
Length = Annotated[int, Meta(ge=1, le=1 << 30)]
Vocab = Annotated[int, Meta(ge=0, le=1 << 26)]
Window = Annotated[int, Meta(ge=0, le=1 << 30)]
# A tensor's bytes sit at most 2^50 (1 PiB) into its file.
Offset = Annotated[int, Meta(ge=0, le=1 << 50)]
MAX_TENSORS = 1_000_000
MAX_SHARDS = 100_000
# Linux NAME_MAX: a longer shard name cannot exist on disk (open fails with ENAMETOOLONG).
NAME_MAX = 255


class RopeScaling(msgspec.Struct, forbid_unknown_fields=False):
    factor: Annotated[float, Meta(gt=0, le=1e6)] | None = None
    original_max_position_embeddings: Length | None = None


class ModelConfig(msgspec.Struct, forbid_unknown_fields=False):
    """The fields of config.json that the plan computes with, typed and range-checked. Fields absent
    here are skipped by the parser (under its recursion guard) and read by nobody as numbers."""

    model_type: str | None = None
    architectures: Annotated[list[str], Meta(max_length=64)] | None = None
    torch_dtype: str | None = None
    dtype: str | None = None
    num_hidden_layers: Layers | None = None
    num_attention_heads: Heads | None = None
    num_key_value_heads: Heads | None = None
    hidden_size: Dim | None = None
    head_dim: SmallDim | None = None
    # Gemma 3n gives one per layer (transformers 5.19 Gemma3nTextConfig: int | list[int]).
    intermediate_size: Dim | Annotated[list[Dim], Meta(max_length=4096)] | None = None
    moe_intermediate_size: Dim | None = None
    vocab_size: Vocab | None = None
    max_position_embeddings: Length | None = None
    n_positions: Length | None = None
    max_seq_len: Length | None = None
    seq_length: Length | None = None
    model_max_length: Length | None = None
    max_target_positions: Length | None = None
    max_sequence_length: Length | None = None
    max_seq_length: Length | None = None
    sliding_window: bool | Window | None = None
    # EXAONE 4's Hub configs spell it "LLLG" (transformers 5.19 Exaone4Config: str | int).
    sliding_window_pattern: Layers | Annotated[str, Meta(max_length=4096)] | None = None
    layer_types: Annotated[list[str], Meta(max_length=4096)] | None = None
    kv_lora_rank: SmallDim | None = None
    qk_rope_head_dim: SmallDim | None = None
    mamba_n_heads: Heads | None = None
    mamba_d_head: SmallDim | None = None
    mamba_d_state: SmallDim | None = None
    mamba_d_conv: SmallDim | None = None
    linear_num_value_heads: Heads | None = None
    linear_value_head_dim: SmallDim | None = None
    linear_key_head_dim: SmallDim | None = None
    linear_conv_kernel_dim: SmallDim | None = None
    rope_scaling: RopeScaling | None = None
    rope_parameters: RopeScaling | None = None
    text_config: ModelConfig | None = None


class TensorEntry(msgspec.Struct, forbid_unknown_fields=False):
    """One tensor of a safetensors header (dtype and shape are skipped: only the offsets are summed).
    `__metadata__` (a string map) decodes as an entry without offsets."""

    data_offsets: tuple[Offset, Offset] | None = None


SafetensorsHeaderDoc = Annotated[dict[str, TensorEntry], Meta(max_length=MAX_TENSORS)]


@dataclass(frozen=True)
class SafetensorsHeader:
    """What a header says that the plan needs: how many tensors and their total bytes."""

    tensors: int
    tensor_bytes: int


class ShardIndex(msgspec.Struct, forbid_unknown_fields=False):
    weight_map: Annotated[dict[str, str], Meta(max_length=MAX_TENSORS)] = {}


def decode_config(data: bytes, source: str) -> dict:
    """config.json as a JSON object, after its numeric fields passed ModelConfig's types and ranges."""
    try:
        documents.decode(data, ModelConfig, source, MAX_CONFIG_BYTES)
        return documents.load_object(data, source, MAX_CONFIG_BYTES)
    except documents.DocumentError as exc:
        raise ModelFilesError(
            f"{exc}: rocmdoctor reads that key with the type and range transformers gives it; "
            "fix the value or the file"
        ) from None


def read_config(path: Path) -> dict:
    return decode_config(read_file(path, MAX_CONFIG_BYTES), str(path))


def parse_header(blob: bytes, source: str) -> SafetensorsHeader:
    try:
        doc = documents.decode(blob, SafetensorsHeaderDoc, f"{source}: the safetensors header", len(blob))
    except documents.DocumentError as exc:
        raise ModelFilesError(str(exc)) from None
    total = 0
    tensors = 0
    for name, entry in doc.items():
        if name == "__metadata__":
            continue
        offsets = entry.data_offsets
        if offsets is None or offsets[1] < offsets[0]:
            raise ModelFilesError(
                f"{source}: the safetensors header: tensor {name[:200]!r} has no valid data_offsets"
            )
        total += offsets[1] - offsets[0]
        tensors += 1
    return SafetensorsHeader(tensors, total)


def _read_exact(stream: BinaryIO, n: int, source: str) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise ModelFilesError(f"{source}: truncated (wanted {n} bytes, got {len(data)})")
    return data


def read_header(path: Path) -> SafetensorsHeader:
    """The header of one local safetensors file: 8 + N bytes read (N bounded first), nothing more."""
    try:
        # non-blocking open and a regular file only: a FIFO named *.safetensors must not hang plan
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as stream:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ModelFilesError(f"{path} is not a regular file; not a safetensors shard")
            length = header_length(stream.read(8), str(path))
            return parse_header(_read_exact(stream, length, str(path)), str(path))
    except OSError as exc:
        raise ModelFilesError(f"cannot read {path}: {exc.strerror or exc}") from None


def read_file(path: Path, limit: int) -> bytes:
    try:
        return read_regular(path, limit)
    except OSError as exc:
        raise ModelFilesError(f"cannot read {path}: {exc.strerror or exc}") from None


def shard_names(index_data: bytes, source: str) -> list[str]:
    """The distinct shard files of a model.safetensors.index.json, in order of first use (linear time)."""
    try:
        index = documents.decode(index_data, ShardIndex, source, MAX_INDEX_BYTES)
    except documents.DocumentError as exc:
        raise ModelFilesError(str(exc)) from None
    if not index.weight_map:
        raise ModelFilesError(f"{source}: no weight_map")
    names = list(dict.fromkeys(index.weight_map.values()))
    if len(names) > MAX_SHARDS:
        raise ModelFilesError(
            f"{source}: names {len(names)} shards, more than {MAX_SHARDS}; not a model index"
        )
    for name in names:
        if len(name.encode("utf-8", "surrogatepass")) > NAME_MAX:
            raise ModelFilesError(
                f"{source}: field weight_map: shard name {name[:60]!r}... is {len(name)} characters, longer "
                f"than a file name can be ({NAME_MAX} bytes); not a real shard: fix or re-download the index"
            )
        if "/" in name or name.startswith(".") or not name.endswith(".safetensors") or "\x00" in name:
            raise ModelFilesError(
                f"{source}: field weight_map: shard name {name[:200]!r} is not a plain .safetensors file name"
            )
    return names


@dataclass
class ModelFiles:
    """What was read: the config and every shard's header, and where from."""

    source: str  # "local directory" | "Hugging Face cache" | "Hugging Face Hub"
    location: str
    config: dict
    headers: list[SafetensorsHeader] = field(default_factory=list)
    weights_note: str | None = None  # why the weights' size is unknown, when it is
    bytes_read: int = 0


def read_local(directory: Path, source: str = "local directory") -> ModelFiles:
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise ModelFilesError(
            f"{directory} has no config.json; point --model at a model directory "
            "(the folder holding config.json and *.safetensors) or a Hugging Face id"
        )
    config = read_config(config_path)
    files = ModelFiles(source, str(directory), config)
    index_path = directory / INDEX_FILE
    if index_path.is_file():
        names = shard_names(read_file(index_path, MAX_INDEX_BYTES), str(index_path))
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


_COMMIT = re.compile(r"[0-9a-f]{40}")
# A branch or tag name as git allows it (git-check-ref-format), minus what could leave a directory:
# no "..", no leading "/" or ".", no "//", no control characters, no backslash.
_REF_NAME = re.compile(r"(?!.*\.\.)(?!.*//)(?![/.])[A-Za-z0-9._/+-]{1,200}(?<![/.])")
MAX_REF_BYTES = 64


def check_revision(revision: str) -> str:
    """`revision` if it is a 40-hex commit or a branch/tag name; ModelFilesError otherwise."""
    if _COMMIT.fullmatch(revision) or (_REF_NAME.fullmatch(revision) and not revision.endswith(".lock")):
        return revision
    raise ModelFilesError(
        f"--revision {revision[:80]!r} is neither a branch or tag name nor a 40-hex commit; "
        "give one (e.g. main, v1.0, or the commit)"
    )


def _inside(path: Path, tree: Path) -> bool:
    try:
        return path.resolve().is_relative_to(tree.resolve())
    except (OSError, RuntimeError):
        return False


def cached_snapshot(
    model_id: str, revision: str = "main", env: Mapping[str, str] = os.environ
) -> Path | None:
    """The snapshot directory of `model_id` in the local cache, or None when it is not cached.

    The revision is a ref name or a commit (check_revision); a ref file's content must be a 40-hex
    commit (read bounded, never followed as a link); the snapshot must resolve inside the cache."""
    check_revision(revision)
    cache = hub_cache_dir(env)
    repo = cache / ("models--" + model_id.replace("/", "--"))
    if not repo.is_dir():
        return None
    commit = revision
    ref = repo / "refs" / revision
    if not _COMMIT.fullmatch(revision) and ref.is_file():
        try:
            content = read_regular(ref, MAX_REF_BYTES, follow_links=False)
        except OSError as exc:
            raise ModelFilesError(
                f"{ref}: {exc.strerror or exc}; a ref file holds one 40-hex commit (delete it and "
                "download the model again)"
            ) from None
        commit = content.decode("ascii", errors="replace").strip()
        if not _COMMIT.fullmatch(commit):
            raise ModelFilesError(
                f"{ref} does not hold a 40-hex commit; the cache is damaged (delete the ref and "
                "download the model again)"
            )
    snapshot = repo / "snapshots" / commit
    if (snapshot / CONFIG_FILE).is_file() and _inside(snapshot, cache):
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
    return sum(header.tensor_bytes for header in files.headers)
