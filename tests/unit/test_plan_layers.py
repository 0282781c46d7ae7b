"""The per-layer model: every spelling of a layer pattern in published configs gives the layers
transformers 5.19 builds, hybrid models get vLLM 0.32's block-size and state-block rules, and what
cannot be read is refused by name. Expected figures are worked out by hand in each test."""

from __future__ import annotations

import pytest

from harness.tiny_model_builder import arch_config
from rocmdoctor.vllm.memory_plan import (
    GIB,
    ConfigError,
    EngineSettings,
    Memory,
    kv_layout,
    plan_model,
    shape_from_config,
    state_page_bytes,
)

BASE = {
    "hidden_size": 1024,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "max_position_embeddings": 32768,
    "dtype": "bfloat16",
}


def kinds(config: dict) -> list[str]:
    return [layer.kind for layer in shape_from_config(config).layers]


def test_cohere2_sliding_window_pattern_equals_layer_types():
    # Command R7B's config.json carries sliding_window_pattern 4: three sliding layers, then a full one
    old = {**BASE, "model_type": "cohere2", "num_hidden_layers": 8, "sliding_window": 4096}
    pattern = {**old, "sliding_window_pattern": 4}
    types = {**old, "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 2}
    expected = ["sliding", "sliding", "sliding", "full"] * 2
    assert kinds(pattern) == kinds(types) == kinds(old) == expected  # 4 is also the family's default
    # vLLM's commandr.py gives Cohere2's sliding layers sliding_window + 1
    assert {x.window for x in shape_from_config(pattern).layers if x.kind == "sliding"} == {4097}


def test_qwen3_next_full_attention_interval_equals_layer_types():
    old = {
        **BASE,
        "model_type": "qwen3_next",
        "num_hidden_layers": 8,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
    }
    interval = {**old, "full_attention_interval": 4}
    types = {**old, "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2}
    assert kinds(interval) == kinds(types) == kinds(old) == ["state", "state", "state", "full"] * 2


def test_gemma3_pattern_exaone4_and_other_spellings():
    gemma = {**BASE, "model_type": "gemma3_text", "num_hidden_layers": 12, "sliding_window": 512}
    assert kinds({**gemma, "sliding_window_pattern": 6}) == (["sliding"] * 5 + ["full"]) * 2
    assert (
        kinds({**gemma, "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2})
        == (["sliding"] * 5 + ["full"]) * 2
    )
    exaone = {**BASE, "model_type": "exaone4", "num_hidden_layers": 6, "sliding_window": 4096}
    # the int form: (i + 1) % 3 != 0 slides; the string form repeats LLG and ends on a global layer
    assert kinds({**exaone, "sliding_window_pattern": 3}) == ["sliding", "sliding", "full"] * 2
    assert kinds({**exaone, "sliding_window_pattern": "LLLG"}) == ["sliding"] * 3 + [
        "full",
        "sliding",
        "full",
    ]
    assert kinds({**exaone, "sliding_window": None}) == ["full"] * 6
    # Nemotron-H: M Mamba2, * attention, - and E MLP-only (no cache)
    nemotron = {
        **BASE,
        "model_type": "nemotron_h",
        "num_hidden_layers": 6,
        "hybrid_override_pattern": "M-M*-E",
        "mamba_num_heads": 64,
        "mamba_head_dim": 64,
        "ssm_state_size": 128,
        "n_groups": 8,
    }
    assert kinds(nemotron) == ["state", "state", "full"]
    # Jamba: attention where i % attn_layer_period == attn_layer_offset
    jamba = {**BASE, "model_type": "jamba", "num_hidden_layers": 8, "attn_layer_period": 4}
    assert kinds({**jamba, "attn_layer_offset": 2}) == ["state", "state", "full", "state"] * 2
    # LFM2: full_attn_idxs, the rest short-conv
    lfm2 = {**BASE, "model_type": "lfm2", "num_hidden_layers": 4, "conv_L_cache": 3, "conv_dim": 1024}
    assert kinds({**lfm2, "full_attn_idxs": [1, 3]}) == ["state", "full", "state", "full"]
    # Granite-4.0-H's published "mamba"/"attention" are transformers' legacy names
    granite = {**BASE, "model_type": "granitemoehybrid", "num_hidden_layers": 4, "mamba_n_heads": 32}
    legacy = kinds({**granite, "layer_types": ["mamba", "mamba", "mamba", "attention"]})
    assert legacy == kinds({**granite, "layer_types": ["linear_attention"] * 3 + ["full_attention"]})
    assert legacy == ["state", "state", "state", "full"]
    # Llama 4: chunked local attention on the RoPE layers, every 4th layer global
    llama4 = {**BASE, "model_type": "llama4_text", "num_hidden_layers": 8, "attention_chunk_size": 8192}
    assert kinds(llama4) == ["chunked", "chunked", "chunked", "full"] * 2


@pytest.mark.parametrize(
    "config, message",
    [
        ({"layer_types": ["full_attention", "lightning_attention"]}, "layer 1 is 'lightning_attention'"),
        ({"layer_types": ["full_attention"]}, "layer_types names 1 layers"),
        (
            {"model_type": "cohere2", "sliding_window": 128, "sliding_window_pattern": 0},
            "sliding_window_pattern",
        ),
        ({"model_type": "exaone4", "sliding_window": 128, "sliding_window_pattern": "LXG"}, "LXG"),
        ({"hybrid_override_pattern": "M*?"}, "hybrid_override_pattern"),
        (
            {"model_type": "somenewhybrid", "layer_types": ["linear_attention", "full_attention"]},
            "somenewhybrid",
        ),
        (
            {"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"]},
            "linear_num_key_heads",
        ),
        ({"is_encoder_decoder": True}, "encoder-decoder"),
    ],
)
def test_what_cannot_be_planned_exactly_is_refused_by_name(config, message):
    with pytest.raises(ConfigError, match="cannot plan this model exactly") as error:
        shape_from_config({**BASE, "num_hidden_layers": 2, **config})
    assert message in str(error.value)


QWEN3_NEXT_80B_SHAPE = {
    # the sizes of Qwen3-Next-80B-A3B (48 layers, one full-attention layer in four)
    "model_type": "qwen3_next",
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "num_hidden_layers": 48,
    "full_attention_interval": 4,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 262144,
    "dtype": "bfloat16",
}


def test_qwen3_next_block_grows_to_hold_a_gated_delta_net_state():
    shape = shape_from_config(QWEN3_NEXT_80B_SHAPE)
    settings = EngineSettings(block_size=16)
    # conv state (128 x 16 x 2 + 128 x 32) x (4 - 1) x 2 B; SSM state 32 x 128 x 128 x 2 B (bf16: auto)
    state = (128 * 16 * 2 + 128 * 32) * 3 * 2 + 32 * 128 * 128 * 2
    assert state_page_bytes(shape, settings) == state == 1097728
    # one token of one attention layer: 2 KV heads x (256 + 256) x 2 B = 2048 B; the block grows in
    # steps of 16 until it holds a state: 16 x cdiv(1097728, 16 x 2048) = 544 tokens
    layout = kv_layout(shape, settings)
    assert layout.block_size == 16 * -(-state // (16 * 2048)) == 544
    assert layout.page_bytes == 544 * 2048
    # 12 full + 36 state layers: groups of 12; one full group, three state groups
    assert sorted((g.kind, g.layers) for g in layout.groups) == [("full", 12)] + [("state", 12)] * 3
    assert layout.bytes_per_block == 12 * 544 * 2048
    # 262144 tokens: cdiv(262144, 544) = 482 full blocks + 3 groups x 2 state blocks ("align")
    assert layout.blocks_per_request(262144) == 482 + 3 * 2
    off = kv_layout(shape, EngineSettings(block_size=16, enable_prefix_caching=False))
    assert off.blocks_per_request(262144) == 482 + 3 * 1
    # TP 2 halves the state and the KV heads alike: the block stays 544
    assert kv_layout(shape, EngineSettings(block_size=16, tensor_parallel_size=2)).block_size == 544
    # a float32 SSM state doubles its part: 16 x cdiv(49152 + 2097152, 32768) = 16 x 66
    f32 = kv_layout(shape, EngineSettings(block_size=16, mamba_ssm_cache_dtype="float32"))
    assert f32.block_size == 16 * -(-(49152 + 32 * 128 * 128 * 4) // 32768) == 1056


def test_mamba2_hybrid_takes_three_state_blocks_with_prefix_caching():
    # the engine test's tiny Granite-4.0-H (tests/harness/tiny_model_builder.py), in bfloat16
    granite = {**arch_config("granitehybrid", 64), "dtype": "bfloat16"}
    shape = shape_from_config(granite)
    settings = EngineSettings(block_size=128, async_scheduling=False, mamba_ssm_cache_dtype="float32")
    # conv (2 x 128 + 2 x 1 x 64) x 3 x 2 B + SSM 4 x 64 x 64 x 4 B = 2304 + 65536
    assert state_page_bytes(shape, settings) == 67840
    layout = kv_layout(shape, settings)
    # attention: 1 KV head x 128 x 2 B = 256 B a token; 128 x cdiv(67840, 128 x 256) = 384
    assert layout.block_size == 384
    # 1 full + 3 state layers: group size 1, four groups; 1 GiB / (384 x 256 B) = 10922 blocks
    assert layout.num_blocks(GIB) == GIB // (384 * 256) == 10922
    # 512 tokens: cdiv(512, 384) = 2 blocks + 3 groups x (2 + 1 checkpoint) = 11
    plan = plan_model(
        "g", granite, None, Memory(0, 1.0, "--kv-cache-memory", GIB), settings=settings, max_model_len=512
    )
    assert plan.max_concurrency == pytest.approx(10922 / 11)
    assert plan.kv_cache_tokens == int(10922 / 11 * 512)
    assert plan.block_size == 384
    assert any("raises --block-size 128" in a for a in plan.assumptions)
    assert any("'align', 3 block(s)" in a for a in plan.assumptions)


def test_async_scheduling_and_pipeline_parallel_set_the_batches_in_flight():
    assert EngineSettings().in_flight_tokens == 2 * 2048
    assert EngineSettings(async_scheduling=False).in_flight_tokens == 2048
    # vLLM's V1 model runner turns async scheduling off with PP: PP-size batches in flight
    assert EngineSettings(pipeline_parallel_size=4).in_flight_tokens == 4 * 2048
    cohere = {
        **BASE,
        "model_type": "cohere2",
        "num_hidden_layers": 8,
        "sliding_window": 4096,
        "max_position_embeddings": 131072,
    }
    shape = shape_from_config(cohere)
    # sliding group: cdiv(min(4097 - 1 + in-flight, len), 16) + 1 blocks
    on = kv_layout(shape, EngineSettings(block_size=16)).blocks_per_request(131072)
    off = kv_layout(shape, EngineSettings(block_size=16, async_scheduling=False)).blocks_per_request(131072)
    full = 131072 // 16
    assert on == full + 3 * (-(-(4096 + 4096) // 16) + 1)
    assert off == full + 3 * (-(-(4096 + 2048) // 16) + 1)
    # PP 2: each GPU holds 1 full and 3 sliding layers of its stage
    pp = kv_layout(shape, EngineSettings(block_size=16, pipeline_parallel_size=2))
    assert sorted((g.kind, g.layers) for g in pp.groups) == [("full", 1)] + [("sliding", 1)] * 3


def test_serve_plans_with_the_vllm_flags_it_passes_through():
    from rocmdoctor.provision.server.plan_settings import engine_settings

    base = EngineSettings(tensor_parallel_size=2)
    got = engine_settings(
        base,
        [
            "--no-enable-prefix-caching",
            "--no-async-scheduling",
            "--block-size=32",
            "--pipeline-parallel-size",
            "2",
            "--mamba-ssm-cache-dtype",
            "float32",
            "--max-num-batched-tokens",
            "8192",
        ],
    )
    assert (got.enable_prefix_caching, got.async_scheduling, got.block_size) == (False, False, 32)
    assert (got.pipeline_parallel_size, got.mamba_ssm_cache_dtype, got.max_num_batched_tokens) == (
        2,
        "float32",
        8192,
    )
    assert got.tensor_parallel_size == 2
    # values vLLM would reject are left to vLLM: the plan keeps its defaults
    assert engine_settings(base, ["--block-size", "zero", "--mamba-cache-dtype", "int4"]) == base


HYBRIDS = {
    "granitemoehybrid": {"layer_types": ["mamba", "attention"], "mamba_n_heads": 8, "mamba_d_state": 64},
    "falcon_h1": {"mamba_n_heads": 8, "mamba_d_head": 64, "mamba_d_state": 64, "mamba_d_ssm": 512},
    "nemotron_h": {
        "hybrid_override_pattern": "M*",
        "mamba_num_heads": 8,
        "mamba_head_dim": 64,
        "ssm_state_size": 64,
        "n_groups": 2,
    },
    "qwen3_next": {
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 8,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "full_attention_interval": 2,
    },
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    "lfm2": {"conv_L_cache": 3, "conv_dim": 1024, "full_attn_idxs": [1]},
}


@pytest.mark.parametrize("family", sorted(HYBRIDS))
@pytest.mark.parametrize("bad", ["64", -1, 0, True, 2.5, None, [1], {"x": 1}])
def test_hostile_values_in_any_state_key_are_a_config_error(family, bad):
    config = {**BASE, "model_type": family, "num_hidden_layers": 2, **HYBRIDS[family]}
    plan_model("m", config, None, Memory(0, 1.0, "--kv-cache-memory", GIB))  # the good config plans
    for key in HYBRIDS[family]:
        hostile = {**config, key: bad}
        try:
            plan_model("m", hostile, None, Memory(0, 1.0, "--kv-cache-memory", GIB))
        except ConfigError:
            pass  # refused by name; planning with a default (None = the family's default) is fine too
