"""Which KV-cache spec vLLM gives each decoder layer, read from config.json the way transformers and
vLLM read it. Pure functions, no I/O; `model_plan` does the arithmetic on the result.

Versions cited: transformers 5.19 (configuration_<family>.py, configuration_utils.py) and vLLM 0.32
(vllm/model_executor/models/<family>.py, vllm/model_executor/layers/mamba/mamba_utils.py). A layer is
one of vLLM's KV cache specs (vllm/v1/kv_cache_interface.py):

- "full" (FullAttentionSpec), "mla" (MLAAttentionSpec), "sliding" (SlidingWindowSpec),
  "chunked" (ChunkedLocalAttentionSpec, Llama 4's local attention);
- "state" (MambaSpec): a recurrent state of a fixed size per request, not per token, for Mamba2,
  gated delta net (Qwen3-Next's linear attention), Mamba1 and short-conv layers.

A layer type or a pattern rocmdoctor does not know is a ConfigError that says so: the plan never
guesses full attention for a layer it cannot read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """config.json cannot be planned; the message says which field and what to do."""


@dataclass(frozen=True, slots=True)
class StateShape:
    """One recurrent layer's state, as vLLM's MambaStateShapeCalculator takes it (mamba_utils.py)."""

    family: str  # "mamba2" | "gated_delta_net" | "mamba1" | "short_conv"
    dims: tuple[int, ...]
    # vLLM 0.32 NemotronHForCausalLMConfig (models/config.py): the SSM state defaults to float32.
    ssm_float32_default: bool = False

    @property
    def prefill_checkpoint_blocks(self) -> int:
        """Extra state blocks in "align" mode: MambaMixer2.get_kv_cache_spec sets
        num_prefill_checkpoint_blocks=1 (vllm/model_executor/layers/mamba/mamba_mixer2.py); the
        gated-delta-net, Mamba1 and short-conv layers keep the MambaSpec default 0."""
        return 1 if self.family == "mamba2" else 0


@dataclass(frozen=True, slots=True)
class Layer:
    """One decoder layer's cache, as vLLM's KV cache spec of it."""

    kind: str  # "full" | "sliding" | "chunked" | "mla" | "state"
    window: int | None = None  # "sliding": the window vLLM passes; "chunked": attention_chunk_size
    state: StateShape | None = None
    # An attention layer's own total KV heads, K and V head sizes (MLA: the latent head, V 0).
    kv_heads: int = 0
    head_size: int = 0
    head_size_v: int = 0
    # vLLM's kv_sharing_target_layer_name: this layer reads the cache of layer `shares` and has none
    # of its own (the model runner gives it no KV cache spec).
    shares: int | None = None

    @property
    def cached(self) -> bool:
        return self.shares is None


# transformers 5.19 configuration_utils.py ALLOWED_ATTN_LAYER_TYPES and _LEGACY_LAYER_TYPE_REMAP
# ("mamba" -> "linear_attention", "attention" -> "full_attention"): the cache each name means.
# "hybrid" (Falcon-H1) holds an attention and a Mamba2 mixer in one layer: vLLM registers both caches.
# "moe"/"mlp" (Nemotron-H) are MLP-only layers with no cache.
LAYER_TYPE_CACHES: dict[str, tuple[str, ...]] = {
    "full_attention": ("full",),
    "attention": ("full",),
    "sliding_attention": ("sliding",),
    "sliding_window_attention": ("sliding",),
    "chunked_attention": ("chunked",),
    "linear_attention": ("state",),
    "mamba": ("state",),
    "mamba2": ("state",),
    "conv": ("state",),
    "hybrid": ("full", "state"),
    "moe": (),
    "mlp": (),
}
# Families whose layers differ in KV heads, head size or sharing (`per_layer_attention`,
# `kv_sharing_targets`): one layer type name per layer.
PER_LAYER_FAMILIES = frozenset({"gemma3n_text", "gemma4_text", "step3p5"})
# Nemotron-H's hybrid_override_pattern (transformers 5.19 NemotronHConfig._pattern_to_list).
NEMOTRON_PATTERN = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}


def _positive(config: dict, key: str, default: Any = None) -> int:
    value = config.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"config.json: {key!r} must be a positive integer, not {value!r}")
    return value


def _needs(config: dict, family: str, *keys: str) -> None:
    missing = [key for key in keys if config.get(key) is None]
    if missing:
        raise ConfigError(
            f"cannot plan this model exactly: {family} state layers need {', '.join(missing)} "
            "in config.json to size their recurrent state"
        )


def state_shape(config: dict) -> StateShape:
    """The recurrent state of this family's state layers, with the config keys its vLLM model reads."""
    model_type = str(config.get("model_type", ""))
    if model_type == "granitemoehybrid":
        # vLLM granitemoehybrid.py get_mamba_state_shape_from_config; transformers 5.19
        # GraniteMoeHybridConfig defaults (n_groups 1, d_state 256, d_conv 4, expand 2, d_head "auto").
        intermediate = _positive(config, "mamba_expand", 2) * _positive(config, "hidden_size")
        heads = _positive(config, "mamba_n_heads", 128)
        head = config.get("mamba_d_head", "auto")
        head = intermediate // heads if head in (None, "auto") else _positive(config, "mamba_d_head")
        return StateShape(
            "mamba2",
            (
                intermediate,
                _positive(config, "mamba_n_groups", 1),
                heads,
                head,
                _positive(config, "mamba_d_state", 256),
                _positive(config, "mamba_d_conv", 4),
            ),
        )
    if model_type == "falcon_h1":
        # vLLM falcon_h1.py: intermediate = mamba_d_ssm, else mamba_expand * hidden_size.
        _needs(config, "Falcon-H1", "mamba_n_heads", "mamba_d_head", "mamba_d_state")
        intermediate = (
            _positive(config, "mamba_d_ssm")
            if config.get("mamba_d_ssm") is not None
            else _positive(config, "mamba_expand", 2) * _positive(config, "hidden_size")
        )
        return StateShape(
            "mamba2",
            (
                intermediate,
                _positive(config, "mamba_n_groups", 1),
                _positive(config, "mamba_n_heads"),
                _positive(config, "mamba_d_head"),
                _positive(config, "mamba_d_state"),
                _positive(config, "mamba_d_conv", 4),
            ),
        )
    if model_type == "nemotron_h":
        # vLLM nemotron_h.py: intermediate = mamba_num_heads * mamba_head_dim.
        _needs(config, "Nemotron-H", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups")
        heads, head = _positive(config, "mamba_num_heads"), _positive(config, "mamba_head_dim")
        return StateShape(
            "mamba2",
            (
                heads * head,
                _positive(config, "n_groups"),
                heads,
                head,
                _positive(config, "ssm_state_size"),
                _positive(config, "conv_kernel", 4),
            ),
            ssm_float32_default=True,
        )
    if model_type in ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"):
        # vLLM qwen3_next.py / qwen3_5.py: MambaStateShapeCalculator.gated_delta_net_state_shape.
        keys = (
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
        )
        _needs(config, "gated-delta-net (linear attention)", *keys)
        return StateShape(
            "gated_delta_net",
            (*(_positive(config, key) for key in keys), _positive(config, "linear_conv_kernel_dim", 4)),
        )
    if model_type == "jamba":
        # vLLM jamba.py: mamba1_state_shape(mamba_expand * hidden_size, mamba_d_state, mamba_d_conv);
        # transformers 5.19 JambaConfig defaults (expand 2, d_state 16, d_conv 4).
        return StateShape(
            "mamba1",
            (
                _positive(config, "mamba_expand", 2) * _positive(config, "hidden_size"),
                _positive(config, "mamba_d_state", 16),
                _positive(config, "mamba_d_conv", 4),
            ),
        )
    if model_type in ("lfm2", "lfm2_moe"):
        # vLLM lfm2.py: short_conv_state_shape(conv_dim, conv_L_cache); conv_dim is read from
        # config.json as is (transformers 5.19 Lfm2Config has no default for it; conv_L_cache 3).
        _needs(config, "LFM2 short-conv", "conv_dim")
        return StateShape(
            "short_conv",
            (_positive(config, "conv_dim"), _positive(config, "conv_L_cache", 3)),
        )
    raise ConfigError(
        f"cannot plan this model exactly: model_type {model_type!r} has recurrent-state (Mamba/linear "
        "attention/conv) layers whose state size rocmdoctor does not know; known: granitemoehybrid, "
        "falcon_h1, nemotron_h, qwen3_next, qwen3_5, jamba, lfm2"
    )


def state_elements(state: StateShape, tp: int) -> tuple[int, int]:
    """(conv-state elements, SSM-state elements) of one layer on one GPU, as vLLM 0.32's
    MambaStateShapeCalculator (mamba_utils.py) shapes them, without speculative tokens."""

    def divide(n: int) -> int:
        if n % tp:
            raise ConfigError(
                f"cannot plan this model exactly: its {state.family} state dimension {n} does not divide "
                f"over --tensor-parallel-size {tp} (vLLM refuses this split)"
            )
        return n // tp

    if state.family == "mamba2":
        intermediate, groups, heads, head, d_state, d_conv = state.dims
        # extra_groups_for_head_shards: groups are replicated up to the TP size when they do not divide.
        groups += 0 if groups % tp == 0 else tp - groups
        return divide(intermediate + 2 * groups * d_state) * (d_conv - 1), divide(heads) * head * d_state
    if state.family == "gated_delta_net":
        k_heads, v_heads, k_dim, v_dim, d_conv = state.dims
        return divide(k_dim * k_heads * 2 + v_dim * v_heads) * (d_conv - 1), divide(v_heads) * v_dim * k_dim
    if state.family == "mamba1":
        intermediate, d_state, d_conv = state.dims
        return divide(intermediate) * (d_conv - 1), divide(intermediate) * d_state
    conv_dim, cache_len = state.dims  # short_conv: one conv state, no SSM state
    return divide(conv_dim) * (cache_len - 1), 0


def _pattern_every(n: Any, key: str, num_layers: int, every: str, other: str) -> list[str]:
    """transformers' BC rule for an int pattern: layer i is `every` when (i + 1) % n == 0."""
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ConfigError(f"cannot plan this model exactly: {key} is {n!r}, not a positive integer")
    return [every if (i + 1) % n == 0 else other for i in range(num_layers)]


def _index_list(value: Any, key: str, num_layers: int) -> set[int]:
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers for i in value
    ):
        raise ConfigError(f"cannot plan this model exactly: {key} must list layer indices below {num_layers}")
    return set(value)


def layer_type_names(config: dict, num_layers: int) -> tuple[list[str] | None, str]:
    """The transformers layer-type name of each layer and the config key it came from; (None, why)
    when the config names no pattern and the model's family has none either."""
    model_type = str(config.get("model_type", ""))
    for key in ("layer_types", "layers_block_type"):
        types = config.get(key)
        if types is None:
            continue
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise ConfigError(f"cannot plan this model exactly: {key} is not a list of layer type names")
        if len(types) < num_layers:
            raise ConfigError(
                f"cannot plan this model exactly: {key} names {len(types)} layers, "
                f"num_hidden_layers is {num_layers}"
            )
        types = list(types[:num_layers])
        if model_type == "gemma4_text" and types and types[-1] != "full_attention":
            types[-1] = "full_attention"  # transformers 5.19 Gemma4TextConfig forces the last layer full
        return types, key
    pattern = config.get("hybrid_override_pattern")
    if pattern is not None:  # transformers 5.19 NemotronHConfig
        if not isinstance(pattern, str) or any(c not in NEMOTRON_PATTERN for c in pattern):
            raise ConfigError(
                f"cannot plan this model exactly: hybrid_override_pattern {str(pattern)[:80]!r} "
                "is not a string of M, *, - and E"
            )
        return [NEMOTRON_PATTERN[c] for c in pattern], "hybrid_override_pattern"
    if model_type == "afmoe":
        # transformers 5.19 AfmoeConfig: layer i is sliding when (i + 1) % global_attn_every_n_layers
        # (default 4), else full: 3 sliding to 1 full.
        n = config.get("global_attn_every_n_layers", 4)
        names = _pattern_every(
            n, "global_attn_every_n_layers", num_layers, "full_attention", "sliding_attention"
        )
        return names, f"global_attn_every_n_layers {n}"
    if model_type == "gemma3n_text":
        # transformers 5.19 Gemma3nTextConfig: full attention where (i + 1) % 5 == 0.
        names = _pattern_every(5, "layer_types", num_layers, "full_attention", "sliding_attention")
        return names, "no layer_types (the family's default, 4 sliding : 1 full)"
    if model_type == "gemma4_text":
        # transformers 5.19 Gemma4TextConfig: 5 sliding : 1 full; the last layer is forced full.
        names = _pattern_every(6, "layer_types", num_layers, "full_attention", "sliding_attention")
        names[-1] = "full_attention"
        return names, "no layer_types (the family's default, 5 sliding : 1 full, the last full)"
    if model_type == "step3p5" and config.get("sliding_window") is not None:
        # vLLM 0.32 step3p5.py Step3p5Attention: without layer_types the even layers slide.
        return [
            "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)
        ], "no layer_types (vLLM's step3p5.py: even layers slide)"
    if model_type == "qwen3_next":
        # transformers 5.19 Qwen3NextConfig: full_attention_interval (default 4).
        n = config.get("full_attention_interval", 4)
        names = _pattern_every(n, "full_attention_interval", num_layers, "full_attention", "linear_attention")
        return names, f"full_attention_interval {n}"
    window_key = "sliding_window_pattern"
    raw = config.get(window_key, config.get("_sliding_window_pattern"))
    if model_type in ("cohere2", "gemma3_text", "gemma3", "olmo3", "gemma2", "gpt_oss"):
        if config.get("sliding_window") is None:
            return ["full_attention"] * num_layers, "no sliding_window"
        # transformers 5.19: Cohere2Config and Olmo3Config default 4, Gemma3TextConfig 6,
        # Gemma2Config and GptOssConfig alternate (2); each: (i + 1) % n == 0 is full attention.
        default = {"cohere2": 4, "olmo3": 4, "gemma2": 2, "gpt_oss": 2}.get(model_type, 6)
        n = default if raw is None or model_type in ("gemma2", "gpt_oss", "olmo3") else raw
        names = _pattern_every(n, window_key, num_layers, "full_attention", "sliding_attention")
        return names, f"{window_key} {n}" + (" (the family's default)" if raw is None else "")
    if model_type == "exaone4":
        # transformers 5.19 Exaone4Config: no sliding_window means no sliding layers; an int n makes
        # (i + 1) % n != 0 sliding; the documented string form ("LLLG") repeats from layer 0 and the
        # final layer is always global.
        if config.get("sliding_window") is None:
            return ["full_attention"] * num_layers, "no sliding_window"
        raw = 4 if raw is None else raw
        if isinstance(raw, str):
            if not raw or any(c not in "LG" for c in raw):
                raise ConfigError(f"cannot plan this model exactly: sliding_window_pattern {raw[:40]!r}")
            names = [
                "sliding_attention" if raw[i % len(raw)] == "L" else "full_attention"
                for i in range(num_layers)
            ]
            names[-1] = "full_attention"
            return names, f"{window_key} {raw!r}"
        names = _pattern_every(raw, window_key, num_layers, "full_attention", "sliding_attention")
        return names, f"{window_key} {raw}"
    if model_type == "jamba":
        # transformers 5.19 JambaConfig.layers_block_type: attention where i % period == offset.
        period = _positive(config, "attn_layer_period", 8)
        offset = config.get("attn_layer_offset", 4)
        names = ["attention" if i % period == offset else "mamba" for i in range(num_layers)]
        return names, f"attn_layer_period {period}, attn_layer_offset {offset}"
    if model_type in ("lfm2", "lfm2_moe"):
        # transformers 5.19 Lfm2Config: full_attn_idxs (default: every layer).
        idxs = config.get("full_attn_idxs")
        indices = set(range(num_layers)) if idxs is None else _index_list(idxs, "full_attn_idxs", num_layers)
        return ["full_attention" if i in indices else "conv" for i in range(num_layers)], "full_attn_idxs"
    if model_type == "falcon_h1":
        # transformers 5.19 FalconH1Config.layers_block_type: every layer "hybrid".
        return ["hybrid"] * num_layers, "Falcon-H1 (attention and Mamba2 in every layer)"
    if model_type == "granitemoehybrid":
        # transformers 5.19 GraniteMoeHybridConfig: no layer_types means every layer is Mamba2.
        return ["linear_attention"] * num_layers, "no layer_types (the family's default)"
    if model_type in ("llama4_text", "llama4") and config.get("attention_chunk_size"):
        # transformers 5.19 Llama4TextConfig: chunked attention on RoPE layers (no_rope_layers[i] == 1),
        # by default every layer but each no_rope_layer_interval-th (4).
        flags = config.get("no_rope_layers")
        if not flags:
            interval = _positive(config, "no_rope_layer_interval", 4)
            flags = [int((i + 1) % interval != 0) for i in range(num_layers)]
        if not isinstance(flags, list) or len(flags) < num_layers:
            raise ConfigError("cannot plan this model exactly: no_rope_layers does not cover every layer")
        return ["chunked_attention" if f else "full_attention" for f in flags[:num_layers]], "no_rope_layers"
    return None, "no layer_types"


def cache_kinds(config: dict, num_layers: int) -> tuple[list[str], str]:
    """The cache kinds ("full" / "sliding" / "chunked" / "state") of every layer in order (a Falcon-H1
    layer gives two) and where the pattern came from."""
    names, source = layer_type_names(config, num_layers)
    if names is None:
        window = config.get("sliding_window")
        if config.get("use_sliding_window") is False or not isinstance(window, int) or window <= 0:
            return ["full"] * num_layers, "no layer_types or sliding_window"
        # vLLM's Mistral/Qwen2-style models pass sliding_window to every Attention layer.
        return ["sliding"] * num_layers, "no layer_types; sliding_window on every layer"
    kinds: list[str] = []
    for i, name in enumerate(names):
        caches = LAYER_TYPE_CACHES.get(name)
        if caches is None:
            raise ConfigError(
                f"cannot plan this model exactly: layer {i} is {name[:60]!r} ({source}), a layer type "
                f"rocmdoctor does not know; known: {', '.join(sorted(LAYER_TYPE_CACHES))}"
            )
        kinds.extend(caches)
    return kinds, source


def window_for(config: dict) -> int | None:
    """The sliding window vLLM gives a sliding layer. vLLM 0.32 commandr.py: Cohere2 layers see
    sliding_window + 1 tokens, so it passes sliding_window + 1 (and the cache keeps one more)."""
    window = config.get("sliding_window")
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
        return None
    return window + 1 if config.get("model_type") == "cohere2" else window


def layer_count(config: dict) -> int:
    """num_hidden_layers; for Nemotron-H re-saved by transformers 5 (no num_hidden_layers), the length
    of its layer pattern, as NemotronHConfig.num_hidden_layers derives it (transformers 5.19)."""
    value = config.get("num_hidden_layers")
    if value is None and config.get("model_type") == "nemotron_h":
        for key in ("layers_block_type", "layer_types", "hybrid_override_pattern"):
            pattern = config.get(key)
            if isinstance(pattern, (list, str)) and pattern:
                return len(pattern)
    if value is None:
        raise ConfigError(
            "config.json has no 'num_hidden_layers' (and no layer pattern to count); "
            "is this a causal language model's config?"
        )
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"config.json: 'num_hidden_layers' must be a positive integer, not {value!r}")
    return value


def per_layer_attention(
    config: dict, names: list[str] | None, kv_heads: int, head: int
) -> list[tuple[int, int]]:
    """Each layer's (total KV heads, head size) where the family sizes layers apart (vLLM 0.32):
    Gemma 4's full-attention layers (gemma4.py per_layer_config: global_head_dim, default 512, and
    num_global_key_value_heads where attention_k_eq_v), Step-3.5's attention_other_setting
    (step3p5.py: the layers of its attention_type get its num_attention_groups and head_dim)."""
    n = len(names or [])
    sizes = [(kv_heads, head)] * n
    model_type = config.get("model_type")
    if model_type == "gemma4_text" and names:
        overrides = config.get("per_layer_config")
        if overrides is not None:
            return _per_layer_overrides(overrides, n, kv_heads, head)
        global_head = _positive(config, "global_head_dim", 512)
        global_kv = config.get("num_global_key_value_heads")
        if global_kv is not None and config.get("attention_k_eq_v", False):
            global_kv = _positive(config, "num_global_key_value_heads")
        else:
            global_kv = kv_heads
        sizes = [(global_kv, global_head) if t == "full_attention" else (kv_heads, head) for t in names]
    if model_type == "step3p5" and names:
        other = config.get("attention_other_setting")
        if other is not None:
            if not isinstance(other, dict) or not isinstance(other.get("attention_type"), str):
                raise ConfigError(
                    "cannot plan this model exactly: attention_other_setting has no attention_type"
                )
            groups = _positive(other, "num_attention_groups")
            other_head = _positive(other, "head_dim")
            sizes = [
                (groups, other_head) if t == other["attention_type"] else (kv_heads, head) for t in names
            ]
    return sizes


def _per_layer_overrides(overrides: Any, n: int, kv_heads: int, head: int) -> list[tuple[int, int]]:
    """transformers 5.19 per_layer_config (HeterogeneousConfigMixin), as a re-saved Gemma 4 config
    spells its global layers: {"<layer index>": {"head_dim": ..., "num_key_value_heads": ...}}; vLLM's
    gemma4.py sizes each layer from `config.per_layer_config[layer_idx]`."""
    if not isinstance(overrides, dict):
        raise ConfigError(
            "cannot plan this model exactly: per_layer_config is not a mapping of layer indices"
        )
    sizes = [(kv_heads, head)] * n
    for key, entry in overrides.items():
        index = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 6 else -1
        if not 0 <= index < n or not isinstance(entry, dict):
            raise ConfigError(
                f"cannot plan this model exactly: per_layer_config key {str(key)[:20]!r} is no layer below {n}"
            )
        unknown = sorted(set(entry) - {"head_dim", "num_key_value_heads"})
        if unknown:
            raise ConfigError(
                f"cannot plan this model exactly: per_layer_config {unknown[0][:60]!r} is not modelled "
                "(rocmdoctor reads head_dim and num_key_value_heads per layer)"
            )
        sizes[index] = (
            _positive(entry, "num_key_value_heads", kv_heads),
            _positive(entry, "head_dim", head),
        )
    return sizes


def kv_sharing_targets(config: dict, names: list[str] | None) -> list[int | None]:
    """Per layer, the layer whose KV cache it reads (vLLM's kv_sharing_target_layer_name), else None.
    Gemma 3n (gemma3n.py): a sharing layer reads layer first_shared - 2 (sliding) or - 1 (full);
    Gemma 4 (gemma4.py): the last non-shared layer of its own type."""
    n = len(names or [])
    shared = config.get("num_kv_shared_layers")
    model_type = config.get("model_type")
    if model_type == "gemma3n_text" and shared is None:
        shared = 15  # transformers 5.19 Gemma3nTextConfig default
    if not shared or not names:
        return [None] * n
    if isinstance(shared, bool) or not isinstance(shared, int) or not 0 < shared <= n:
        raise ConfigError(f"cannot plan this model exactly: num_kv_shared_layers {shared!r} is not 0..{n}")
    first = n - shared
    targets: list[int | None] = [None] * first
    for i in range(first, n):
        if model_type == "gemma3n_text":
            target = first - (2 if names[i] == "sliding_attention" else 1)
        else:
            earlier = [j for j in range(first) if names[j] == names[i]]
            target = earlier[-1] if earlier else -1
        targets.append(target if target >= 0 else None)
    return targets
