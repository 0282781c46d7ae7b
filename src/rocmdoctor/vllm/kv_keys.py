"""The config.json keys that change the KV cache layout in vLLM 0.32's model files, and which
model types rocmdoctor models each of them for. Knowledge as data, each row citing the vLLM file
that reads the key (vllm/model_executor/models/<file>.py unless said otherwise).

The rule (`refuse_unmodelled`): a key of `KV_LAYOUT_KEYS` that the config sets (not null, not
false/0/empty) while its model_type is not among the types the row lists as modelled makes the
plan refuse with "cannot plan this model exactly: <key> is not modelled"; the plan never falls back
from a spelling it does not read to a default.
"""

from __future__ import annotations

from typing import Any

from rocmdoctor.vllm.layers import ConfigError

# vLLM 0.32 vllm/transformers_utils/model_arch_config_convertor.py `is_deepseek_mla`: the model types
# whose kv_lora_rank means one MLA latent head per token. Any other model type with kv_lora_rank
# keeps ordinary attention (MiniCPM3's minicpm3.py) or is refused.
MLA_MODEL_TYPES = frozenset(
    {
        "axk1",
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "deepseek_mtp",
        "dots3_note",
        "k3_dspark",
        "glm5_next",
        "glm5_next_text",
        "glm_moe_dsa",
        "glm4_moe_lite",
        "glm4_moe_lite_mtp",
        "kimi_k2",
        "kimi_linear",
        "longcat_flash",
        "pangu_ultra_moe",
        "pangu_ultra_moe_mtp",
        "bailing_hybrid",
        "bailing_hybrid_mtp",
        "bailing_hybrid_v3_mtp",
        "hy_v4",
        "hy_v4_mtp",
    }
)
# `get_total_num_kv_heads` (same file): the first of these the config sets, else num_attention_heads.
KV_HEAD_KEYS = (
    "n_head_kv",
    "num_kv_heads",
    "num_key_value_heads",
    "multi_query_group_num",
    "num_attention_groups",
)

# The families whose recurrent state `layers.state_shape` sizes (the vLLM files it cites).
STATE_FAMILIES = frozenset(
    {
        "granitemoehybrid",
        "falcon_h1",
        "nemotron_h",
        "qwen3_next",
        "qwen3_5_text",
        "qwen3_5_moe_text",
        "jamba",
        "lfm2",
        "lfm2_moe",
    }
)
# Keys that size a recurrent (Mamba, linear-attention, short-conv) state in the configs vLLM's
# MambaStateShapeCalculator callers read (mamba_utils.py and the model files above): on any other
# family the state is not modelled, whatever its layer pattern says.
STATE_KEYS = (
    "state_size",
    "ssm_state_size",
    "mamba_d_state",
    "d_state",
    "mamba_d_conv",
    "conv_kernel",
    "linear_conv_kernel_dim",
    "conv_L_cache",
    "mamba_expand",
    "mamba_n_heads",
    "mamba_num_heads",
    "linear_num_value_heads",
)
_GEMMA_SLIDING = frozenset({"cohere2", "gemma3_text", "gemma3", "gemma2", "gpt_oss", "olmo3", "exaone4"})
# key -> (the model types whose rule rocmdoctor implements, where vLLM reads it).
KV_LAYOUT_KEYS: dict[str, tuple[frozenset[str], str]] = {
    "kv_lora_rank": (MLA_MODEL_TYPES | {"minicpm3"}, "is_deepseek_mla; minicpm3.py (ordinary attention)"),
    "linear_attn_config": (frozenset(), "kimi_linear.py (KDA linear-attention state layers)"),
    "compress_ratios": (frozenset(), "deepseek_v4.py (compressed attention)"),
    "index_topk": (frozenset(), "deepseek_v2.py (DeepSeek-V3.2 sparse-attention indexer cache)"),
    "block_configs": (frozenset(), "nemotron_nas.py (per-block attention, some blocks without one)"),
    "cross_attention_layers": (frozenset(), "mllama.py (cross-attention sized by the encoder)"),
    "attn_type_list": (frozenset(), "minimax_text_01.py (lightning-attention state layers)"),
    "num_kv_shared_layers": (
        frozenset({"gemma3n_text", "gemma4_text"}),
        "gemma3n.py, gemma4.py (KV sharing)",
    ),
    "kv_sharing_target_layer_name": (frozenset(), "a per-layer sharing target rocmdoctor does not read"),
    "global_head_dim": (frozenset({"gemma4_text"}), "gemma4.py per_layer_config"),
    "num_global_key_value_heads": (frozenset({"gemma4_text"}), "gemma4.py per_layer_config"),
    "per_layer_config": (frozenset({"gemma4_text"}), "gemma4.py per_layer_config"),
    "attention_other_setting": (frozenset({"step3p5"}), "step3p5.py (per-type heads and head size)"),
    "global_attn_every_n_layers": (frozenset({"afmoe"}), "afmoe.py layer_types (transformers' AfmoeConfig)"),
    "sliding_window_pattern": (_GEMMA_SLIDING, "the families' layer_types (transformers' configs)"),
    "_sliding_window_pattern": (_GEMMA_SLIDING, "the families' layer_types (transformers' configs)"),
    "hybrid_override_pattern": (frozenset({"nemotron_h"}), "nemotron_h.py"),
    "full_attention_interval": (frozenset({"qwen3_next"}), "qwen3_next.py"),
    "attn_layer_period": (frozenset({"jamba"}), "jamba.py"),
    "attn_layer_offset": (frozenset({"jamba"}), "jamba.py"),
    "full_attn_idxs": (frozenset({"lfm2", "lfm2_moe"}), "lfm2.py"),
    "attention_chunk_size": (frozenset({"llama4_text", "llama4"}), "llama4.py (chunked local attention)"),
    "interleaved_sliding_window": (frozenset(), "an older sliding-window spelling"),
    "sliding_window_layers": (frozenset(), "a per-layer sliding-window list rocmdoctor does not read"),
}
KV_LAYOUT_KEYS.update({key: (STATE_FAMILIES, "a recurrent state (mamba_utils.py)") for key in STATE_KEYS})


def _set(value: Any) -> bool:
    return value not in (None, False, 0, "", [], {})


def refuse_unmodelled(config: dict) -> None:
    """Refuse a config that sets a KV-layout key whose rule rocmdoctor does not implement for its model
    type. Kimi-Linear's linear_attn_config is read here, before the MLA rule."""
    model_type = str(config.get("model_type", ""))
    for key, (modelled, where) in KV_LAYOUT_KEYS.items():
        if _set(config.get(key)) and model_type not in modelled:
            raise ConfigError(
                f"cannot plan this model exactly: {key} is not modelled for model_type {model_type[:60]!r} "
                f"(vLLM reads it in {where})"
            )


def total_kv_heads(config: dict, heads: int) -> tuple[int, str]:
    """vLLM's total KV heads and the key it came from."""
    for key in KV_HEAD_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(
                f"config.json: {key!r} (the KV head count) must be a positive integer, not {value!r}"
            )
        return value, key
    return heads, "num_attention_heads"
