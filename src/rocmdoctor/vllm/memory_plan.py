"""Will this model fit? vLLM's KV cache arithmetic, from a model's config.json and weight headers.

Pure functions, no I/O: `checks/` (check --model), `provision/` (unit, serve) and `rocmdoctor plan`
all call `plan_model()`. The rules mirror vLLM 0.32 (vllm/v1/kv_cache_interface.py and
vllm/v1/core/kv_cache_utils.py); each rule names the vLLM function it copies. The rules that differ in
the older versions the bundles carry (0.19.1-0.25.1) are one table, `plan_versions.RULES`, chosen by
`EngineSettings.vllm_version`:

- page of one layer = block_size x heads x (head_size + head_size_v) x dtype bytes
  (`AttentionSpec.page_size_bytes`); MLA stores one latent head of kv_lora_rank + qk_rope_head_dim
  and no separate V (`MLAAttentionSpec`, head_size_v = 0);
- KV heads per GPU = max(1, kv_heads // tp) (`ModelConfig.get_num_kv_heads`): divided, or
  replicated when there are fewer than the TP size; MLA is always one head;
- layers are grouped (`_get_kv_cache_groups_uniform_page_size`): one group for a uniform model, else
  groups of `group_size` layers per attention type, padded; a block is one page of every layer of
  the largest group (`_get_kv_cache_bytes_per_block`), num_blocks = KV bytes // bytes per block;
- a request at max_model_len takes cdiv(len, block) blocks per full group,
  cdiv(min(window - 1 + in-flight tokens, len), block) + 1 per sliding group
  (`SlidingWindowSpec.max_admission_blocks_per_request`), cdiv(min(chunk + in-flight, len), block)
  per chunked-local group (`ChunkedLocalAttentionSpec`) and, per recurrent-state group, 1 block
  without prefix caching or 2 (+1 prefill checkpoint for Mamba2) in "align" mode with it
  (`MambaSpec.max_memory_usage_bytes`); in-flight tokens = max_num_batched_tokens x the batches in
  flight (`VllmConfig.max_concurrent_batches`: 2 with async scheduling, else the PP size);
- a hybrid model's attention block grows until one page holds a state, and the state page is padded
  to the attention page (`Platform._align_hybrid_block_size`, vllm/platforms/interface.py);
- the log line `KV cache size: N tokens, Maximum concurrency for L tokens per request: Cx` is
  C = num_blocks / blocks per request and N = int(C x L) (`get_kv_cache_capacity`);
- vLLM refuses to start when one request at max_model_len needs more than the KV memory less one
  block (the null block; `get_kv_cache_configs` + `_check_enough_kv_cache_memory`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from rocmdoctor.model import envelope
from rocmdoctor.vllm.kv_keys import refuse_unmodelled, total_kv_heads
from rocmdoctor.vllm.layers import (
    PER_LAYER_FAMILIES,
    StateShape,
    cache_kinds,
    kv_sharing_targets,
    layer_count,
    layer_type_names,
    per_layer_attention,
    state_elements,
    state_shape,
    window_for,
)

# ConfigError and Layer are re-exported: callers of the plan import them from here.
from rocmdoctor.vllm.layers import ConfigError as ConfigError
from rocmdoctor.vllm.layers import Layer as Layer
from rocmdoctor.vllm.plan_versions import DEFAULT_VERSION, VersionRules, rules_for

GIB = 1 << 30

# Bytes per element, by the names config.json (torch dtypes) and --kv-cache-dtype use.
TORCH_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
# vLLM 0.32 vllm/config/cache.py MambaDType: --mamba-cache-dtype / --mamba-ssm-cache-dtype.
MAMBA_DTYPES = ("auto", "float32", "bfloat16", "float16")
# vLLM's defaults (vllm/config/cache.py, vllm/engine/arg_utils.py for the OpenAI server).
DEFAULT_BLOCK_SIZE = 16
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
# Keys vLLM reads the model's context length from, smallest wins (`derived_max_model_len_and_key`).
MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# RoPE types whose max_position_embeddings is already the scaled length (`_get_and_verify_max_len`).
ROPE_ALREADY_SCALED = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
# A length worth planning concurrency for when the user names none.
DEFAULT_TYPICAL_LEN = 4096


# transformers' defaults for keys a family's config.json may leave out (configuration_<family>.py).
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "head_dim": 256,
        "num_key_value_heads": 4,
    },
    # transformers 5.19 AfmoeConfig, Gemma3nTextConfig, Gemma4TextConfig; vLLM 0.32 Step3p5Config.
    "afmoe": {"sliding_window": 1024},
    "gemma3n_text": {"sliding_window": 512, "head_dim": 256, "num_key_value_heads": 2},
    "gemma4_text": {"sliding_window": 512, "head_dim": 256, "num_key_value_heads": 4},
    "step3p5": {"num_attention_groups": 8},
}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the KV arithmetic needs from config.json."""

    architecture: str
    model_type: str
    dtype: str
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int
    mla_head_size: int | None
    layers: tuple[Layer, ...]
    max_position: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    notes: tuple[str, ...] = ()

    @property
    def is_mla(self) -> bool:
        return self.mla_head_size is not None


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The vLLM settings the arithmetic depends on."""

    tensor_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    block_size: int = DEFAULT_BLOCK_SIZE
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    hybrid_allocator: bool = True
    # vLLM 0.32's defaults on a GPU: VllmConfig.__post_init__ (vllm/config/vllm.py) turns async
    # scheduling on unless something rules it out; EngineArgs (vllm/engine/arg_utils.py) turns prefix
    # caching on where ModelConfig.is_prefix_caching_supported, true for decoder models.
    async_scheduling: bool = True
    enable_prefix_caching: bool = True
    pipeline_parallel_size: int = 1
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    # The vLLM that will serve: the rules that differ by version come from its row (plan_versions.py).
    vllm_version: str = DEFAULT_VERSION

    @property
    def rules(self) -> VersionRules:
        return rules_for(self.vllm_version)

    @property
    def local_batches(self) -> int:
        """The batches of max_num_batched_tokens a sliding/chunked layer keeps beyond its window: every
        batch in flight at 0.32 (`max_in_flight_tokens`), one before (`max_num_batched_tokens`)."""
        return self.concurrent_batches if self.rules.local_keeps_every_batch else 1

    @property
    def concurrent_batches(self) -> int:
        """vLLM 0.32 `VllmConfig.max_concurrent_batches` (vllm/config/vllm.py) with the V1 model
        runner: 2 with async scheduling and no PP, else the PP size (async is turned off with PP)."""
        if self.async_scheduling and self.pipeline_parallel_size <= 1:
            return 2
        return self.pipeline_parallel_size

    @property
    def in_flight_tokens(self) -> int:
        """What a sliding/chunked layer keeps beyond its window: `VllmConfig.max_in_flight_tokens` (every
        batch in flight may hold max_num_batched_tokens) at 0.32, one batch's before (plan_versions.py)."""
        return self.max_num_batched_tokens * self.local_batches

    @property
    def mamba_cache_mode(self) -> str:
        """vLLM 0.32 MambaModelConfig.verify_and_update_config (vllm/model_executor/models/config.py):
        "align" when prefix caching is on, "none" when it is off."""
        return "align" if self.enable_prefix_caching else "none"


def _int(config: dict, key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        if value is None:
            raise ConfigError(f"config.json has no {key!r}; is this a causal language model's config?")
        raise ConfigError(f"config.json: {key!r} must be a positive integer, not {value!r}")
    return value


def text_config(config: dict) -> dict:
    """The language model's config: multimodal models keep it under text_config."""
    if not isinstance(config, dict):
        raise ConfigError("config.json is not a JSON object")
    inner = config.get("text_config")
    if isinstance(inner, dict) and ("num_hidden_layers" in inner or "hidden_size" in inner):
        merged = dict(inner)
        for key in ("torch_dtype", "dtype", "architectures"):
            merged.setdefault(key, config.get(key))
        merged["_outer_model_type"] = config.get("model_type")
        config = merged
    defaults = FAMILY_DEFAULTS.get(str(config.get("model_type")), {})
    if defaults:
        config = {**defaults, **{k: v for k, v in config.items() if v is not None}}
    return config


def model_dtype(config: dict) -> str:
    """vLLM's dtype "auto": the config's dtype, float32 downcast to bfloat16 (`_resolve_auto_dtype`)."""
    raw = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    name = str(raw).removeprefix("torch.")
    if name not in TORCH_DTYPE_BYTES:
        raise ConfigError(f"config.json: unknown dtype {raw!r}")
    return "bfloat16" if name in ("float32", "float") else name


def derived_max_len(config: dict) -> int:
    """The model's context length the way vLLM derives it (`_get_and_verify_max_len`)."""
    values = [
        config[k]
        for k in MAX_LEN_KEYS
        if isinstance(config.get(k), int) and not isinstance(config.get(k), bool) and config[k] > 0
    ]
    if not values:
        return 2048  # vLLM's own fallback, with a warning
    length = float(min(values))
    rope = config.get("rope_scaling") or config.get("rope_parameters")
    model_type = str(config.get("model_type", "")) + str(config.get("_outer_model_type", ""))
    if isinstance(rope, dict) and "gemma3" not in model_type:
        rope_type = rope.get("rope_type") or rope.get("type") or "default"
        factor = rope.get("factor")
        if (
            rope_type not in ROPE_ALREADY_SCALED
            and rope_type != "default"
            and isinstance(factor, (int, float))
        ):
            length *= factor
    return int(length)


def _mla_or_attention(
    config: dict, heads: int, kv_heads: int, head_dim: int
) -> tuple[int | None, int, int, str | None]:
    """(MLA latent head size or None, KV heads, head size, note) by vLLM 0.32's rule: MLA only for the
    model types `is_deepseek_mla` lists; MiniCPM3 (minicpm3.py) keeps ordinary attention with
    num_kv_heads = num_heads and head size qk_nope_head_dim + qk_rope_head_dim."""
    if config.get("kv_lora_rank") is None:
        return None, kv_heads, head_dim, None
    if config.get("model_type") == "minicpm3":
        head = _int(config, "qk_nope_head_dim") + _int(config, "qk_rope_head_dim")
        return None, heads, head, f"MiniCPM3: ordinary attention, {heads} KV heads of {head} (not MLA)"
    latent = _int(config, "kv_lora_rank") + _int(config, "qk_rope_head_dim")
    note = f"MLA: one latent head of {config['kv_lora_rank']} + {config['qk_rope_head_dim']} per token"
    return latent, kv_heads, head_dim, note


def _build_layers(
    config: dict, num_layers: int, kv_heads: int, head_dim: int, mla: int | None
) -> tuple[list[Layer], str]:
    """Every layer's KV cache spec (kind, window or chunk, state, KV heads, head sizes, sharing target)."""
    if mla is not None:
        return [Layer("mla", kv_heads=1, head_size=mla)] * num_layers, "MLA"
    kinds, source = cache_kinds(config, num_layers)
    window = window_for(config)
    if "sliding" in kinds and window is None:
        raise ConfigError(
            f"config.json: sliding-window layers but sliding_window is {config.get('sliding_window')!r}, "
            "not a positive integer"
        )
    if config.get("model_type") == "gemma4_text" and config.get("use_bidirectional_attention") == "all":
        window = window // 2 + 1 if window else window  # transformers 5.19 Gemma4TextConfig.__post_init__
    state = state_shape(config) if "state" in kinds else None
    chunk = _int(config, "attention_chunk_size") if "chunked" in kinds else None
    names = None
    if len(kinds) == num_layers and config.get("model_type") in PER_LAYER_FAMILIES:
        names, _ = layer_type_names(config, num_layers)
    sizes = per_layer_attention(config, names, kv_heads, head_dim) or [(kv_heads, head_dim)] * len(kinds)
    targets = kv_sharing_targets(config, names) or [None] * len(kinds)
    layers = []
    for kind, (heads, head), target in zip(kinds, sizes, targets, strict=True):
        if kind == "state":
            layers.append(Layer("state", state=state))
            continue
        local = window if kind == "sliding" else chunk if kind == "chunked" else None
        layers.append(Layer(kind, local, kv_heads=heads, head_size=head, head_size_v=head, shares=target))
    return layers, source


def shape_from_config(raw_config: dict) -> ModelShape:
    """Read the fields the KV arithmetic needs; ConfigError names the one that is missing or wrong."""
    config = text_config(raw_config)
    architectures = config.get("architectures") or raw_config.get("architectures") or ["?"]
    if raw_config.get("is_encoder_decoder") or config.get("is_encoder_decoder"):
        # vLLM 0.32 CrossAttentionSpec sizes cross-attention by the encoder's input length
        # (scheduler max_num_encoder_input_tokens), which config.json does not give.
        raise ConfigError(
            "cannot plan this model exactly: it is an encoder-decoder model (cross-attention layers); "
            "their cache is sized by the encoder's input length, which rocmdoctor does not model"
        )
    refuse_unmodelled(config)
    num_layers = layer_count(config)
    heads = _int(config, "num_attention_heads")
    hidden = _int(config, "hidden_size")
    kv_heads, _ = total_kv_heads(config, heads)
    head_dim_raw = config.get("head_dim")
    head_dim = head_dim_raw if isinstance(head_dim_raw, int) and head_dim_raw > 0 else hidden // heads
    if head_dim <= 0:
        raise ConfigError("config.json: hidden_size / num_attention_heads is 0; give head_dim")
    mla, kv_heads, head_dim, mla_note = _mla_or_attention(config, heads, kv_heads, head_dim)
    layers, source = _build_layers(config, num_layers, kv_heads, head_dim, mla)
    notes = [mla_note] if mla_note else []
    if mla is None:
        kinds = [layer.kind for layer in layers]
        counts = {kind: kinds.count(kind) for kind in dict.fromkeys(kinds)}
        notes.append("layers: " + ", ".join(f"{n} {kind}" for kind, n in counts.items()) + f" ({source})")
    shared = sum(1 for layer in layers if not layer.cached)
    if shared:
        notes.append(f"KV sharing: {shared} layers read an earlier layer's cache and hold none of their own")
    shapes = {(x.kv_heads, x.head_size) for x in layers if x.kind != "state" and x.cached}
    if len(shapes) > 1:
        notes.append(
            "per-layer shapes (KV heads x head size): " + ", ".join(f"{h}x{d}" for h, d in sorted(shapes))
        )
    intermediate = config.get("intermediate_size") or config.get("moe_intermediate_size") or 4 * hidden
    if isinstance(intermediate, list):  # Gemma 3n: one per layer (transformers 5.19 Gemma3nTextConfig)
        intermediate = max(intermediate)
    vocab = config.get("vocab_size") or 0
    return ModelShape(
        architecture=str(architectures[0]),
        model_type=str(config.get("model_type", "?")),
        dtype=model_dtype(config),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        head_dim_v=head_dim,
        mla_head_size=mla,
        layers=tuple(layers),
        max_position=derived_max_len(config),
        hidden_size=hidden,
        intermediate_size=int(intermediate),
        vocab_size=int(vocab),
        notes=tuple(notes),
    )


def kv_element_bytes(shape: ModelShape, kv_cache_dtype: str) -> int:
    if kv_cache_dtype == "auto":
        return TORCH_DTYPE_BYTES[shape.dtype]
    if kv_cache_dtype not in TORCH_DTYPE_BYTES:
        raise ConfigError(
            f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, not {kv_cache_dtype!r}"
        )
    return TORCH_DTYPE_BYTES[kv_cache_dtype]


def kv_heads_per_gpu(shape: ModelShape, tp: int) -> int:
    if shape.is_mla:
        return 1
    return max(1, shape.num_kv_heads // tp)


def layer_bytes_per_token(shape: ModelShape, settings: EngineSettings, layer: Layer | None = None) -> int:
    """One attention layer's KV bytes for one token on one GPU: `layer`'s own heads and head sizes
    (`AttentionSpec.page_size_bytes` / block_size), or without one the model-wide figure vLLM's
    ModelConfig gives (`get_num_kv_heads`, `get_head_size`), which the hybrid alignment uses."""
    element = kv_element_bytes(shape, settings.kv_cache_dtype)
    if layer is not None and layer.head_size:
        if layer.kind == "mla":
            return layer.head_size * element
        heads = max(1, layer.kv_heads // settings.tensor_parallel_size)
        return heads * (layer.head_size + layer.head_size_v) * element
    if shape.is_mla:
        return shape.mla_head_size * element  # type: ignore[operator]
    return (
        kv_heads_per_gpu(shape, settings.tensor_parallel_size) * (shape.head_dim + shape.head_dim_v) * element
    )


def kv_bytes_per_token(shape: ModelShape, settings: EngineSettings) -> int:
    """Bytes of KV cache one token of context costs on one GPU, every attention layer with a cache of
    its own counted (a sliding-window layer stops growing at its window; see `KVLayout`)."""
    return sum(
        layer_bytes_per_token(shape, settings, layer)
        for layer in shape.layers
        if layer.kind != "state" and layer.cached
    )


@dataclass(frozen=True, slots=True)
class KVGroup:
    kind: str  # "full" (MLA too) | "sliding" | "chunked" | "state"
    window: int | None  # sliding window or attention chunk size
    layers: int  # real layers; the group is padded to the layout's group_size
    state_blocks: int = 0  # "state": blocks one request holds, whatever its length
    block_size: int = 0  # tokens per block when page unification raised it (0: the layout's)


@dataclass(frozen=True, slots=True)
class KVLayout:
    """vLLM's KV cache groups for one GPU, and the byte cost of one block of the shared pool."""

    block_size: int  # after the hybrid alignment
    page_bytes: int  # one layer, one block (a state page is padded to it)
    group_size: int
    groups: tuple[KVGroup, ...]
    in_flight_tokens: int
    state_page_bytes: int = 0  # one state layer's real state, before padding
    block_bytes: int = 0  # one group of layers of different pages (0: group_size x page_bytes)
    rules: VersionRules = rules_for(DEFAULT_VERSION)  # the serving vLLM's start-up check and log line

    @property
    def bytes_per_block(self) -> int:
        return self.block_bytes or self.group_size * self.page_bytes

    def blocks_per_request(self, length: int) -> int:
        total = 0
        for group in self.groups:
            block = group.block_size or self.block_size
            if group.kind == "state":
                total += group.state_blocks
            elif group.kind == "sliding" and group.window is not None:
                tokens = min(group.window - 1 + self.in_flight_tokens, length)
                total += math.ceil(tokens / block) + 1
            elif group.kind == "chunked" and group.window is not None:
                tokens = min(group.window + self.in_flight_tokens, length)
                total += math.ceil(tokens / block)
            else:
                total += math.ceil(length / block)
        return total

    def num_blocks(self, kv_bytes: int) -> int:
        return max(0, kv_bytes) // self.bytes_per_block

    def fits(self, kv_bytes: int, length: int) -> bool:
        """vLLM's start-up check: one request of `length` in the KV memory less the null block."""
        usable = kv_bytes - (self.bytes_per_block if self.rules.check_reserves_null_block else 0)
        return usable > 0 and self.bytes_per_block * self.blocks_per_request(length) <= usable

    def largest_fitting(self, kv_bytes: int, upper: int) -> int:
        """vLLM's binary search (`_estimate_max_model_len_from_groups`): 0 when not even 1 token fits."""
        if not self.fits(kv_bytes, 1):
            return 0
        low, high, best = 1, upper, 1
        while low <= high:
            mid = (low + high) // 2
            if self.fits(kv_bytes, mid):
                best, low = mid, mid + 1
            else:
                high = mid - 1
        return best

    def concurrency(self, kv_bytes: int, length: int) -> float:
        blocks = self.blocks_per_request(length)
        return self.num_blocks(kv_bytes) / blocks if blocks else 0.0

    def cache_tokens(self, kv_bytes: int, length: int) -> int:
        """What vLLM logs as `KV cache size: N tokens` (by the serving version's rule, plan_versions.py)."""
        if not self.rules.tokens_from_concurrency:
            return (
                self.num_blocks(kv_bytes)
                // len(self.groups)
                * min(g.block_size or self.block_size for g in self.groups)
            )
        return int(self.concurrency(kv_bytes, length) * length)


def _mamba_dtype_bytes(name: str, what: str) -> int:
    if name not in MAMBA_DTYPES or name == "auto":
        raise ConfigError(f"{what} must be one of {', '.join(MAMBA_DTYPES)}, not {name!r}")
    return TORCH_DTYPE_BYTES[name]


def state_page_bytes(shape: ModelShape, settings: EngineSettings) -> int:
    """One state layer's page on one GPU (`MambaSpec.page_size_bytes` before padding); 0 without
    state layers. Dtypes: vLLM 0.32 MambaStateDtypeCalculator (mamba_utils.py): the conv state in
    --mamba-cache-dtype ("auto": the model's dtype), the SSM state in --mamba-ssm-cache-dtype ("auto":
    the conv state's dtype, float32 for Nemotron-H)."""
    state = next((layer.state for layer in shape.layers if layer.state is not None), None)
    if state is None:
        return 0
    conv = TORCH_DTYPE_BYTES[shape.dtype]
    if settings.mamba_cache_dtype != "auto":
        conv = _mamba_dtype_bytes(settings.mamba_cache_dtype, "--mamba-cache-dtype")
    if settings.mamba_ssm_cache_dtype != "auto":
        ssm = _mamba_dtype_bytes(settings.mamba_ssm_cache_dtype, "--mamba-ssm-cache-dtype")
    else:
        ssm = 4 if state.ssm_float32_default else conv
    conv_elements, ssm_elements = state_elements(state, settings.tensor_parallel_size)
    return conv_elements * conv + ssm_elements * ssm


def state_blocks_per_request(state: StateShape, settings: EngineSettings) -> int:
    """`MambaSpec.max_memory_usage_bytes` / page: 1 block in "none" mode; 2 + the prefill checkpoint
    blocks in "align" mode (vllm/v1/kv_cache_interface.py)."""
    if settings.mamba_cache_mode == "align":
        return 2 + state.prefill_checkpoint_blocks
    return 1


def hybrid_block_size(shape: ModelShape, settings: EngineSettings, state_page: int) -> int:
    """vLLM 0.32 `Platform._align_hybrid_block_size` (vllm/platforms/interface.py): the smallest
    multiple of the kernel block (here the block size; at least 128 for MLA) whose attention page
    holds one state page; never below the block size asked for."""
    block = settings.block_size
    if not state_page or all(layer.kind == "state" for layer in shape.layers):
        return block
    align = max(block, 128) if shape.is_mla else block
    needed = align * math.ceil(state_page / (align * layer_bytes_per_token(shape, settings)))
    return max(block, needed)


def _check_settings(settings: EngineSettings) -> None:
    if settings.block_size < 1:
        raise ConfigError(f"--block-size must be positive, not {settings.block_size}")
    if settings.tensor_parallel_size < 1:
        raise ConfigError(f"--tensor-parallel-size must be 1 or more, not {settings.tensor_parallel_size}")
    if settings.pipeline_parallel_size < 1:
        raise ConfigError(
            f"--pipeline-parallel-size must be 1 or more, not {settings.pipeline_parallel_size}"
        )


def _unified_block(kind: str, page: int, largest: int, block: int) -> int:
    """vLLM 0.32 `unify_kv_cache_spec_page_size`: a layer of a smaller page gets a block that many
    times larger when its page divides the largest; otherwise a non-MLA page is padded (same block)
    and an MLA one cannot be unified (vLLM's full-allocation fallback, which rocmdoctor refuses)."""
    if page == largest or largest % page == 0:
        return block * (largest // page)
    if kind == "mla":
        raise ConfigError(
            "cannot plan this model exactly: MLA layers whose page does not divide the largest page "
            "(vLLM's full-allocation fallback is not modelled)"
        )
    return block


def kv_layout(shape: ModelShape, settings: EngineSettings) -> KVLayout:
    """vLLM 0.32 `get_kv_cache_groups` for the layer-outermost KV layouts: one group when every
    cached layer is of one type (`UniformTypeKVCacheSpecs`), else page unification
    (`unify_kv_cache_spec_page_size`) and `_get_kv_cache_groups_uniform_page_size`."""
    _check_settings(settings)
    rules = settings.rules
    if not rules.state_layers and any(layer.kind == "state" for layer in shape.layers):
        raise ConfigError(
            f"cannot plan this model exactly for vLLM {rules.version}: its recurrent-state cache mode and "
            "block alignment are modelled for vLLM 0.32 only"
        )
    state_page = state_page_bytes(shape, settings)
    block = hybrid_block_size(shape, settings, state_page)
    cached = [layer for layer in shape.layers if layer.cached]
    attention = [layer for layer in cached if layer.kind != "state"]
    # A state page is padded to the attention page (`mamba_page_size_padded`); a model of state
    # layers only keeps its own page.
    model_page = block * layer_bytes_per_token(shape, settings) if attention else state_page
    buckets: dict[tuple[str, int | None, int], int] = {}
    state = None
    for layer in cached:
        kind = "full" if layer.kind == "mla" else layer.kind
        window = layer.window
        if kind in ("sliding", "chunked") and not settings.hybrid_allocator:
            kind, window = "full", None  # without the hybrid allocator local layers keep the whole context
        if kind == "full":
            window = None
        page = (
            model_page if layer.state is not None else block * layer_bytes_per_token(shape, settings, layer)
        )
        if layer.state is not None:
            state = layer.state
        key = (kind, window, page)
        buckets[key] = buckets.get(key, 0) + 1
    if not buckets:
        raise ConfigError("config.json: the model has no layer with a KV cache")
    # Pipeline parallelism: each GPU holds its stage's share of every group (vLLM get_pp_indices
    # splits the layers evenly); the plan takes the largest share.
    pp = settings.pipeline_parallel_size
    buckets = {key: math.ceil(count / pp) for key, count in buckets.items()}
    pages = {page for _, _, page in buckets}
    kinds = {(kind, window) for kind, window, _ in buckets}
    if len(pages) > 1 and not rules.mixed_pages:
        raise ConfigError(
            f"cannot plan this model exactly for vLLM {rules.version}: its layers have different page "
            "sizes, whose unification is modelled for vLLM 0.32 only"
        )
    if len(pages) > 1 and len(kinds) == 1 and state is None:
        # UniformTypeKVCacheSpecs: one group of every layer, each with its own page.
        (kind, window), layers = next(iter(kinds)), sum(buckets.values())
        block_bytes = sum(page * count for (_, _, page), count in buckets.items())
        group = KVGroup(kind, window, layers)
        return KVLayout(
            block, max(pages), layers, (group,), settings.in_flight_tokens, state_page, block_bytes, rules
        )
    largest = max(pages)
    mla = any(layer.kind == "mla" for layer in attention)
    counts = list(buckets.values())
    group_size = min(counts)
    if max(counts) < min(counts) * 1.5:
        group_size = max(counts)
    groups = []
    for (kind, window, page), count in buckets.items():
        # vLLM deals a bucket's layers round-robin into cdiv(count, group_size) groups (layers[i::n]).
        n = math.ceil(count / group_size)
        blocks = state_blocks_per_request(state, settings) if kind == "state" and state else 0
        own = block if kind == "state" else _unified_block("mla" if mla else kind, page, largest, block)
        groups += [
            KVGroup(kind, window, len(range(i, count, n)), blocks, 0 if own == block else own)
            for i in range(n)
        ]
    widest = max(group.layers for group in groups)
    return KVLayout(block, largest, widest, tuple(groups), settings.in_flight_tokens, state_page, 0, rules)


# ---------------------------------------------------------------------------------------------
# The plan: weights, memory, verdict, remedies.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Memory:
    """What vLLM may use on each GPU, and where the figure came from."""

    total_bytes: int  # the GPU's memory (or the pool an APU sizes from)
    utilization: float  # --gpu-memory-utilization
    source: str  # "host" | "--memory" | "--kv-cache-memory"
    kv_cache_bytes: int | None = None  # set: vLLM's --kv-cache-memory-bytes, nothing else counts

    @property
    def requested_bytes(self) -> int:
        return math.ceil(self.total_bytes * self.utilization)


@dataclass(frozen=True, slots=True)
class Remedy:
    action: str
    flag: str
    figure: str
    fits: bool

    def to_json(self) -> dict:
        return {"action": self.action, "flag": self.flag, "figure": self.figure, "fits": self.fits}


@dataclass
class ModelPlan:
    model: str
    shape: ModelShape
    settings: EngineSettings
    weights_bytes: int | None
    weights_source: str
    kv_bytes_per_token: int
    max_model_len_requested: int
    typical_len: int
    memory: Memory | None = None
    memory_null_reason: str | None = None
    runtime_reserve_bytes: int | None = None
    kv_cache_bytes: int | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_model_len: int | None = None  # the largest that fits
    max_num_seqs: int | None = None
    fits: bool | None = None
    reasons: list[str] = field(default_factory=list)
    remedies: list[Remedy] = field(default_factory=list)
    block_size: int = DEFAULT_BLOCK_SIZE  # vLLM's, after the hybrid alignment
    assumptions: list[str] = field(default_factory=list)
    vllm_version_source: str = "rocmdoctor's newest rules (no version named)"

    @property
    def weights_per_gpu_bytes(self) -> int | None:
        if self.weights_bytes is None:
            return None
        return math.ceil(self.weights_bytes / self.settings.tensor_parallel_size)

    def to_json(self) -> dict[str, Any]:
        shape = self.shape
        return envelope(
            model=self.model,
            architecture=shape.architecture,
            dtype=shape.dtype,
            weights_bytes=self.weights_bytes,
            weights_source=self.weights_source,
            weights_per_gpu_bytes=self.weights_per_gpu_bytes,
            kv_bytes_per_token=self.kv_bytes_per_token,
            kv_cache_dtype=self.settings.kv_cache_dtype,
            tensor_parallel_size=self.settings.tensor_parallel_size,
            block_size=self.block_size,
            block_size_requested=self.settings.block_size,
            pipeline_parallel_size=self.settings.pipeline_parallel_size,
            async_scheduling=self.settings.async_scheduling,
            enable_prefix_caching=self.settings.enable_prefix_caching,
            attention={
                "layers": len(shape.layers),
                "full": sum(1 for x in shape.layers if x.kind == "full"),
                "sliding": sum(1 for x in shape.layers if x.kind == "sliding"),
                "mla": sum(1 for x in shape.layers if x.kind == "mla"),
                "chunked": sum(1 for x in shape.layers if x.kind == "chunked"),
                "state": sum(1 for x in shape.layers if x.kind == "state"),
                "kv_shared": sum(1 for x in shape.layers if not x.cached),
                "sliding_window": next((x.window for x in shape.layers if x.kind == "sliding"), None),
                "kv_heads_per_gpu": kv_heads_per_gpu(shape, self.settings.tensor_parallel_size),
                "head_dim": shape.mla_head_size if shape.is_mla else shape.head_dim,
            },
            model_max_len=shape.max_position,
            max_model_len_requested=self.max_model_len_requested,
            typical_len=self.typical_len,
            memory_source=self.memory.source if self.memory else None,
            memory_bytes=self.memory.total_bytes if self.memory else None,
            gpu_memory_utilization=self.memory.utilization if self.memory else None,
            runtime_reserve_bytes=self.runtime_reserve_bytes,
            kv_cache_bytes=self.kv_cache_bytes,
            kv_cache_tokens=self.kv_cache_tokens,
            max_concurrency=None if self.max_concurrency is None else round(self.max_concurrency, 2),
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            fits=self.fits,
            null_reason=self.memory_null_reason,
            reasons=list(self.reasons),
            remedies=[r.to_json() for r in self.remedies],
            notes=list(shape.notes),
            assumptions=list(self.assumptions),
            vllm_version=self.settings.vllm_version,
            vllm_rules=self.settings.rules.version,
            vllm_version_source=self.vllm_version_source,
        )


def runtime_reserve(shape: ModelShape, settings: EngineSettings, max_num_seqs: int) -> int:
    """An estimate of what vLLM's profiling run takes besides weights and KV cache: the activations of
    one max_num_batched_tokens forward pass, the sampler's float32 logits and a fixed runtime
    allowance (HIP context, hipBLASLt workspaces, graphs). Not exact: vLLM measures it at start-up."""
    tp = settings.tensor_parallel_size
    dt = TORCH_DTYPE_BYTES[shape.dtype]
    tokens = settings.max_num_batched_tokens
    activations = tokens * (4 * shape.hidden_size + 2 * shape.intermediate_size // tp) * dt
    logits = min(tokens, max_num_seqs) * shape.vocab_size * 4
    return activations + logits + (1 << 30)


def vllm_max_num_seqs_default(memory: Memory | None) -> int:
    return 1024 if memory and memory.total_bytes >= 70 * GIB else 256


def _fmt_gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _kv_budget(
    plan: ModelPlan, shape: ModelShape, settings: EngineSettings, weights: int | None, memory: Memory
) -> tuple[int | None, int | None]:
    """(KV cache bytes per GPU, runtime reserve) for these settings; None when weights are unknown."""
    if memory.kv_cache_bytes is not None:
        return memory.kv_cache_bytes, 0
    if weights is None:
        return None, None
    reserve = runtime_reserve(shape, settings, vllm_max_num_seqs_default(memory))
    return memory.requested_bytes - math.ceil(weights / settings.tensor_parallel_size) - reserve, reserve


def assumptions(shape: ModelShape, settings: EngineSettings, layout: KVLayout) -> list[str]:
    """Each engine setting the figures rest on, in words, for the report."""
    s = settings
    out = [
        f"block size {layout.block_size}"
        + (
            f" (vLLM raises --block-size {s.block_size} so one attention page holds a "
            f"{layout.state_page_bytes} B recurrent state)"
            if layout.block_size != s.block_size
            else " (--block-size)"
        ),
    ]
    local = any(layer.kind in ("sliding", "chunked") for layer in shape.layers)
    if local:
        if s.pipeline_parallel_size > 1:
            why = f"pipeline parallel size {s.pipeline_parallel_size}" + (
                "; vLLM's V1 model runner turns async scheduling off with PP" if s.async_scheduling else ""
            )
        else:
            why = "async scheduling" if s.async_scheduling else "no async scheduling"
        if s.local_batches != s.concurrent_batches:
            why += (
                f"; vLLM {s.rules.version} keeps one batch beyond the window whatever the scheduling "
                "(SlidingWindowSpec.max_memory_usage_bytes)"
            )
        out.append(
            f"{s.local_batches} batch(es) of {s.max_num_batched_tokens} tokens in flight ({why}): "
            f"sliding/chunked layers keep {layout.in_flight_tokens} tokens beyond their window"
        )
    state = next((layer.state for layer in shape.layers if layer.state is not None), None)
    if state is not None:
        blocks = state_blocks_per_request(state, s)
        out.append(
            f"prefix caching {'on' if s.enable_prefix_caching else 'off'}: {state.family} state cache mode "
            f"{s.mamba_cache_mode!r}, {blocks} block(s) per request per state group"
        )
        out.append(
            f"state dtypes: conv {s.mamba_cache_dtype}, SSM {s.mamba_ssm_cache_dtype}"
            + (
                " (float32 for this family)"
                if state.ssm_float32_default and s.mamba_ssm_cache_dtype == "auto"
                else ""
            )
            + f": {layout.state_page_bytes} B per layer per request"
        )
    if s.pipeline_parallel_size > 1:
        out.append(
            f"pipeline parallel size {s.pipeline_parallel_size}: each GPU holds an even share of each "
            "layer group (the largest share is planned)"
        )
    return out


def _evaluate(
    shape: ModelShape, settings: EngineSettings, kv_bytes: int, length: int, typical: int, seqs_cap: int
) -> tuple[KVLayout, int, float, int, int, bool]:
    layout = kv_layout(shape, settings)
    tokens = layout.cache_tokens(kv_bytes, length)
    conc = layout.concurrency(kv_bytes, length)
    largest = layout.largest_fitting(kv_bytes, shape.max_position) if kv_bytes > 0 else 0
    typical_len = min(typical, length)
    usable = max(0, layout.num_blocks(kv_bytes) - 1)
    per_seq = layout.blocks_per_request(typical_len)
    seqs = usable // per_seq if per_seq else seqs_cap
    fits = kv_bytes > 0 and layout.fits(kv_bytes, length)
    return layout, tokens, conc, largest, max(0, min(seqs, seqs_cap)), fits


def plan_model(
    model: str,
    config: dict,
    weights_bytes: int | None,
    memory: Memory | None,
    *,
    settings: EngineSettings = EngineSettings(),
    max_model_len: int | None = None,
    typical_len: int | None = None,
    weights_source: str = "safetensors headers",
    memory_null_reason: str | None = None,
) -> ModelPlan:
    """The whole plan for one model on one host (or on `memory` given by the user)."""
    shape = shape_from_config(config)
    kv_element_bytes(shape, settings.kv_cache_dtype)  # validates the dtype name
    if max_model_len is not None and max_model_len < 1:
        raise ConfigError(f"--max-model-len must be positive, not {max_model_len}")
    requested = max_model_len or shape.max_position
    typical = typical_len or min(requested, DEFAULT_TYPICAL_LEN)
    plan = ModelPlan(
        model,
        shape,
        settings,
        weights_bytes,
        weights_source,
        kv_bytes_per_token(shape, settings),
        requested,
        typical,
    )
    layout = kv_layout(shape, settings)
    plan.block_size = layout.block_size
    plan.assumptions = assumptions(shape, settings, layout)
    if max_model_len is not None and max_model_len > shape.max_position:
        plan.reasons.append(
            f"--max-model-len {max_model_len} is longer than the model's {shape.max_position}: "
            "vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
    if memory is None:
        plan.memory_null_reason = memory_null_reason or "no GPU memory known: pass --memory (per GPU)"
        return plan
    plan.memory = memory
    kv_bytes, reserve = _kv_budget(plan, shape, settings, weights_bytes, memory)
    plan.runtime_reserve_bytes = reserve
    if kv_bytes is None:
        plan.memory_null_reason = (
            "the weights' size is unknown (no safetensors headers), so the KV memory is too"
        )
        return plan
    plan.kv_cache_bytes = kv_bytes
    seqs_cap = vllm_max_num_seqs_default(memory)
    layout, tokens, conc, largest, seqs, fits = _evaluate(
        shape, settings, kv_bytes, requested, typical, seqs_cap
    )
    plan.kv_cache_tokens = max(0, tokens)
    plan.max_concurrency = max(0.0, conc)
    plan.max_model_len = largest
    plan.max_num_seqs = seqs
    plan.fits = fits and not (max_model_len is not None and max_model_len > shape.max_position)
    _explain(plan, layout, memory, kv_bytes)
    if not fits:
        plan.remedies = remedies(plan, config, memory)
    return plan


def _explain(plan: ModelPlan, layout: KVLayout, memory: Memory, kv_bytes: int) -> None:
    s = plan.settings
    if memory.kv_cache_bytes is None and plan.weights_bytes is not None:
        plan.reasons.append(
            f"vLLM gets {_fmt_gib(memory.requested_bytes)} per GPU ({memory.utilization:.2f} x "
            f"{_fmt_gib(memory.total_bytes)}, {memory.source}); weights take {_fmt_gib(plan.weights_per_gpu_bytes or 0)}"
            f"{' per GPU (TP ' + str(s.tensor_parallel_size) + ')' if s.tensor_parallel_size > 1 else ''}, "
            f"activations and runtime about {_fmt_gib(plan.runtime_reserve_bytes or 0)}"
        )
    if kv_bytes <= 0:
        plan.reasons.append(
            f"no memory is left for the KV cache ({_fmt_gib(kv_bytes)}): the weights alone do not fit"
        )
        return
    plan.reasons.append(
        f"KV cache {_fmt_gib(kv_bytes)} = {layout.num_blocks(kv_bytes)} blocks of {layout.block_size} tokens "
        f"({layout.bytes_per_block} B each); {plan.kv_bytes_per_token} B per token per GPU at "
        f"{s.kv_cache_dtype if s.kv_cache_dtype != 'auto' else plan.shape.dtype}"
    )
    needed = layout.bytes_per_block * layout.blocks_per_request(plan.max_model_len_requested)
    if plan.fits:
        plan.reasons.append(
            f"one request of {plan.max_model_len_requested} tokens needs {_fmt_gib(needed)}: "
            f"{plan.max_concurrency:.2f} such requests fit at once"
        )
    else:
        plan.reasons.append(
            f"one request of {plan.max_model_len_requested} tokens needs {_fmt_gib(needed)} of KV cache, more "
            f"than the {_fmt_gib(max(0, kv_bytes - layout.bytes_per_block))} there is: vLLM refuses to start "
            f"(the largest --max-model-len that fits is {plan.max_model_len})"
        )


def remedies(plan: ModelPlan, config: dict, memory: Memory) -> list[Remedy]:
    """What would make it fit, in the order a user should try them, each with its figure."""
    shape, s, out = plan.shape, plan.settings, []
    requested, typical = plan.max_model_len_requested, plan.typical_len
    cap = vllm_max_num_seqs_default(memory)

    def attempt(settings: EngineSettings, weights: int | None) -> tuple[int | None, int, int, bool]:
        kv, _ = _kv_budget(plan, shape, settings, weights, memory)
        if kv is None or kv <= 0:
            return kv, 0, 0, False
        _, tokens, _, largest, _, fits = _evaluate(shape, settings, kv, requested, typical, cap)
        return kv, tokens, largest, fits

    if plan.max_model_len:
        out.append(
            Remedy(
                "shorter context",
                f"--max-model-len {plan.max_model_len}",
                f"{plan.max_model_len} tokens of context fit ({plan.kv_cache_tokens} KV cache tokens)",
                True,
            )
        )
    if kv_element_bytes(shape, s.kv_cache_dtype) > 1:
        fp8 = replace(s, kv_cache_dtype="fp8")
        _, tokens, largest, fits = attempt(fp8, plan.weights_bytes)
        out.append(
            Remedy(
                "fp8 KV cache",
                "--kv-cache-dtype fp8",
                f"{tokens} KV cache tokens; largest --max-model-len {largest}",
                fits,
            )
        )
    if (
        plan.weights_bytes is not None
        and memory.kv_cache_bytes is None
        and TORCH_DTYPE_BYTES[shape.dtype] >= 2
    ):
        quantised = math.ceil(plan.weights_bytes * 4.5 / (8 * TORCH_DTYPE_BYTES[shape.dtype]))
        _, tokens, largest, fits = attempt(s, quantised)
        out.append(
            Remedy(
                "a 4-bit quantised variant (AWQ/GPTQ)",
                "--model <the -AWQ or -GPTQ repository>",
                f"weights about {_fmt_gib(quantised)}; {tokens} KV cache tokens; largest --max-model-len "
                f"{largest}",
                fits,
            )
        )
    for tp in (2, 4, 8):
        if tp <= s.tensor_parallel_size or shape.num_attention_heads % tp:
            continue
        _, tokens, largest, fits = attempt(replace(s, tensor_parallel_size=tp), plan.weights_bytes)
        out.append(
            Remedy(
                f"tensor parallelism over {tp} GPUs",
                f"--tensor-parallel-size {tp}",
                f"{tokens} KV cache tokens per GPU group; largest --max-model-len {largest}",
                fits,
            )
        )
        if fits:
            break
    return out


def weights_from_headers(headers: Iterable) -> int:
    """Exact bytes of every tensor in these safetensors headers (model_files.SafetensorsHeader records,
    whose data_offsets the reader already validated)."""
    return sum(header.tensor_bytes for header in headers)


def plan_from_files(
    files,
    memory: Memory | None,
    *,
    settings: EngineSettings = EngineSettings(),
    max_model_len: int | None = None,
    typical_len: int | None = None,
    memory_null_reason: str | None = None,
    model: str | None = None,
) -> ModelPlan:
    """`plan_model` for a `model_files.ModelFiles` (what `model_files.local_model` or
    `provision.hub.load_model` returned): weights from its headers, or unknown with the reason."""
    weights = None if files.weights_note else weights_from_headers(files.headers)
    return plan_model(
        model or files.location,
        files.config,
        weights,
        memory,
        settings=settings,
        max_model_len=max_model_len,
        typical_len=typical_len,
        weights_source=files.weights_note or f"safetensors headers, {files.source}",
        memory_null_reason=memory_null_reason,
    )
