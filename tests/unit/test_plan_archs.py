"""Issue 37: the plan is exact or refuses on every architecture, by the rule vLLM 0.32's own model
file uses (each test names it). Expected figures are worked out by hand; the engine test
(tests/system/test_plan_engine.py) checks the same families against vLLM's CPU engine."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES
from rocmdoctor.vllm.kv_keys import KV_LAYOUT_KEYS
from rocmdoctor.vllm.memory_plan import (
    ConfigError,
    EngineSettings,
    kv_bytes_per_token,
    kv_layout,
    plan_model,
    shape_from_config,
)
from rocmdoctor.vllm.model_files import ModelFilesError, decode_config

BF16 = EngineSettings()


def parsed(config: dict) -> dict:
    """Through the typed config reader first, as `rocmdoctor plan` reads config.json."""
    return decode_config(json.dumps(config).encode(), "config.json")


def test_minicpm3_is_ordinary_attention_not_mla():
    # MiniCPM3-4B's sizes; vLLM minicpm3.py: Attention(num_heads, qk_nope + qk_rope, num_kv_heads=num_heads)
    config = {
        "model_type": "minicpm3",
        "num_hidden_layers": 62,
        "hidden_size": 2560,
        "num_attention_heads": 40,
        "num_key_value_heads": 40,
        "kv_lora_rank": 256,
        "q_lora_rank": 768,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32,
        "v_head_dim": 64,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
    }
    shape = shape_from_config(parsed(config))
    assert not shape.is_mla and {x.kind for x in shape.layers} == {"full"}
    # 62 layers x 40 heads x (96 + 96) x 2 B; as MLA it would have been 62 x (256 + 32) x 2 = 35712
    assert kv_bytes_per_token(shape, BF16) == 62 * 40 * 192 * 2 == 952320
    # the same keys on an is_deepseek_mla type are MLA
    mla = shape_from_config({**config, "model_type": "deepseek_v3"})
    assert mla.is_mla and kv_bytes_per_token(mla, BF16) == 35712


def test_kv_lora_rank_on_a_model_type_vllm_does_not_list_is_refused():
    config = {"model_type": "mystery", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2}
    with pytest.raises(ConfigError, match="kv_lora_rank is not modelled for model_type 'mystery'"):
        shape_from_config({**config, "kv_lora_rank": 64, "qk_rope_head_dim": 32})


def test_step3p5_kv_heads_are_num_attention_groups_and_sliding_layers_have_their_own():
    # vLLM get_total_num_kv_heads lists num_attention_groups; step3p5.py gives the layers of
    # attention_other_setting's type its heads and head size
    config = {
        "model_type": "step3p5",
        "num_hidden_layers": 4,
        "hidden_size": 512,
        "num_attention_heads": 64,
        "num_attention_groups": 8,
        "head_dim": 128,
        "sliding_window": 512,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"],
        "max_seq_len": 65536,
    }
    plain = shape_from_config(parsed(config))
    assert plain.num_kv_heads == 8  # not the 64 query heads
    assert kv_bytes_per_token(plain, BF16) == 4 * 8 * 256 * 2
    other = {
        "attention_type": "sliding_attention",
        "num_attention_heads": 96,
        "num_attention_groups": 4,
        "head_dim": 64,
    }
    shape = shape_from_config(parsed({**config, "attention_other_setting": other}))
    assert [(x.kind, x.kv_heads, x.head_size) for x in shape.layers] == [("full", 8, 128)] + [
        ("sliding", 4, 64)
    ] * 3
    assert kv_bytes_per_token(shape, BF16) == 8 * 256 * 2 + 3 * 4 * 128 * 2


def test_afmoe_hub_spelling_gives_transformers_three_sliding_to_one_full():
    config = {
        "model_type": "afmoe",
        "num_hidden_layers": 8,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "sliding_window": 1024,
    }
    hub = shape_from_config(parsed({**config, "global_attn_every_n_layers": 4}))
    resaved = shape_from_config(
        parsed({**config, "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 2})
    )
    expected = ["sliding", "sliding", "sliding", "full"] * 2
    assert [x.kind for x in hub.layers] == [x.kind for x in resaved.layers] == expected
    assert {x.window for x in hub.layers if x.kind == "sliding"} == {1024}


def test_exaone4_hub_config_with_lllg_is_read():
    # the real EXAONE-4.0-32B config.json (fixtures SOURCES.md): sliding_window_pattern "LLLG" beside layer_types
    raw = (FIXTURES / "model_configs" / "exaone-4.0-32b" / "config.json").read_bytes()
    shape = shape_from_config(decode_config(raw, "config.json"))
    kinds = [x.kind for x in shape.layers]
    assert kinds == ["sliding", "sliding", "sliding", "full"] * 16
    assert {x.window for x in shape.layers if x.kind == "sliding"} == {4096}
    assert kv_bytes_per_token(shape, BF16) == 64 * 8 * 256 * 2  # 64 layers x 8 KV heads x (128 + 128) x 2 B


def test_nemotron_h_resaved_without_num_hidden_layers_counts_its_pattern():
    # transformers 5.19 NemotronHConfig.num_hidden_layers is len(layers_block_type)
    config = {
        "model_type": "nemotron_h",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "layers_block_type": ["mamba", "moe", "mamba", "attention", "mamba", "mlp"],
        "mamba_num_heads": 8,
        "mamba_head_dim": 32,
        "ssm_state_size": 64,
        "n_groups": 1,
    }
    shape = shape_from_config(parsed(config))
    assert [x.kind for x in shape.layers] == ["state", "state", "full", "state"]
    with pytest.raises(ConfigError, match="no 'num_hidden_layers'"):
        shape_from_config({"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4})


def gemma3n(**extra) -> dict:
    # gemma-3n-E2B's attention: 30 layers, 2 KV heads of 256, 4 sliding (512) : 1 full, 10 shared
    return {
        "model_type": "gemma3n",
        "text_config": {
            "model_type": "gemma3n_text",
            "num_hidden_layers": 30,
            "hidden_size": 2048,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "sliding_window": 512,
            "intermediate_size": [8192] * 30,
            "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 6,
            "num_kv_shared_layers": 10,
            **extra,
        },
    }


def test_gemma3n_per_layer_intermediate_size_and_kv_sharing():
    shape = shape_from_config(parsed(gemma3n()))
    assert shape.intermediate_size == 8192
    # gemma3n.py: layers 20-29 read layer 18 (sliding, first_shared - 2) or 19 (full, first_shared - 1)
    targets = [x.shares for x in shape.layers]
    assert targets[:20] == [None] * 20
    assert targets[20:] == [18, 18, 18, 18, 19, 18, 18, 18, 18, 19]
    # only the 20 layers with a cache of their own count: 20 x 2 x 512 x 2 B
    assert kv_bytes_per_token(shape, BF16) == 20 * 2 * 512 * 2
    layout = kv_layout(shape, BF16)
    assert sum(g.layers for g in layout.groups) == 20


def gemma4(**extra) -> dict:
    # Gemma 4 31B's attention: 60 layers, sliding 16 KV heads of 256 (window 1024), global layers
    # 4 KV heads (attention_k_eq_v) of global_head_dim 512, 5 sliding : 1 full
    return {
        "model_type": "gemma4_text",
        "num_hidden_layers": 60,
        "hidden_size": 5376,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "sliding_window": 1024,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
        "max_position_embeddings": 262144,
        **extra,
    }


def test_gemma4_global_layers_get_their_own_shape_and_larger_blocks():
    hub = shape_from_config(
        parsed(gemma4(global_head_dim=512, num_global_key_value_heads=4, attention_k_eq_v=True))
    )
    full = [x for x in hub.layers if x.kind == "full"]
    assert {(x.kv_heads, x.head_size) for x in full} == {(4, 512)} and len(full) == 10
    # 50 x 16 x 512 x 2 + 10 x 4 x 1024 x 2
    assert kv_bytes_per_token(hub, BF16) == 819200 + 81920
    layout = kv_layout(hub, BF16)
    # unify_kv_cache_spec_page_size: sliding page 16 x 16 x 512 x 2 = 262144 B, global 16 x 4 x 1024 x 2
    # = 131072 B: the global group gets blocks of 32 tokens
    assert layout.page_bytes == 262144
    assert {(g.kind, g.block_size or layout.block_size) for g in layout.groups} == {
        ("sliding", 16),
        ("full", 32),
    }
    # transformers' re-saved spelling: per_layer_config on the full layers
    overrides = {str(i): {"head_dim": 512, "num_key_value_heads": 4} for i in range(5, 60, 6)}
    resaved = shape_from_config(parsed(gemma4(per_layer_config=overrides)))
    assert resaved.layers == hub.layers
    for bad in ({"²": {"head_dim": 512}}, {"60": {"head_dim": 512}}, {"5": {"sliding_window": 4}}, [1]):
        with pytest.raises(ConfigError, match="per_layer_config"):
            shape_from_config(parsed(gemma4(per_layer_config=bad)))
    # num_global_key_value_heads applies only with attention_k_eq_v (Gemma4TextConfig.__post_init__)
    ungated = shape_from_config(parsed(gemma4(global_head_dim=512, num_global_key_value_heads=4)))
    assert {(x.kv_heads, x.head_size) for x in ungated.layers if x.kind == "full"} == {(16, 512)}


def test_gemma4_kv_sharing_reads_the_last_earlier_layer_of_its_type():
    config = gemma4(num_hidden_layers=10, layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 2)
    shape = shape_from_config(parsed({**config, "num_kv_shared_layers": 4, "global_head_dim": 512}))
    # layers 6-9 share: 6, 7, 8 (sliding) read layer 5; 9 (full) reads layer 4
    assert [x.shares for x in shape.layers] == [None] * 6 + [5, 5, 5, 4]
    assert sum(1 for x in shape.layers if x.cached) == 6
    plan = plan_model(
        "gemma4-e2b-shape", {**config, "num_kv_shared_layers": 4, "global_head_dim": 512}, None, None
    )
    assert plan.to_json()["attention"]["kv_shared"] == 4


def test_kimi_linear_is_refused_before_the_mla_rule():
    config = {
        "model_type": "kimi_linear",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4]},
    }
    with pytest.raises(ConfigError, match="linear_attn_config is not modelled"):
        shape_from_config(parsed(config))


def test_a_recurrent_state_of_a_family_rocmdoctor_does_not_size_is_refused():
    # Mamba2ForCausalLM's config: attention-free, its state sized by state_size (mamba2.py)
    config = {
        "model_type": "mamba2",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_heads": 8,
        "state_size": 128,
    }
    with pytest.raises(ConfigError, match="state_size is not modelled for model_type 'mamba2'"):
        shape_from_config(parsed(config))


def test_zamba2_is_refused_by_name():
    config = {
        "model_type": "zamba2",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"],
    }
    with pytest.raises(ConfigError, match="model_type 'zamba2'"):
        shape_from_config(parsed(config))


@pytest.mark.parametrize("key", sorted(KV_LAYOUT_KEYS))
def test_every_kv_layout_key_is_refused_on_a_family_that_does_not_read_it(key: str):
    config = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2}
    with pytest.raises(ConfigError, match=f"cannot plan this model exactly: {key} is not modelled"):
        shape_from_config({**config, key: 2})


def test_config_parser_errors_name_the_key_and_never_ask_if_it_is_a_config():
    with pytest.raises(ModelFilesError) as bad:
        parsed({"model_type": "gemma3n_text", "intermediate_size": ["big"]})
    assert "intermediate_size" in str(bad.value) and "is this a transformers" not in str(bad.value)
