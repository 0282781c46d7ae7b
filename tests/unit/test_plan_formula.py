"""The KV arithmetic on the config.json of real public models (sources in
tests/fixtures/model_configs/SOURCES.md). Every expected figure is derived by hand in the test from
the numbers in the config, never by calling the code under test."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES
from rocmdoctor.vllm.memory_plan import (
    GIB,
    ConfigError,
    EngineSettings,
    Memory,
    kv_bytes_per_token,
    kv_layout,
    plan_model,
    shape_from_config,
)

CONFIGS = FIXTURES / "model_configs"
BF16 = 2


def config(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


def per_token(name: str, **settings) -> int:
    return kv_bytes_per_token(shape_from_config(config(name)), EngineSettings(**settings))


def test_every_fixture_has_a_recorded_source():
    sources = (CONFIGS / "SOURCES.md").read_text()
    for directory in CONFIGS.iterdir():
        if directory.is_dir():
            assert f"`{directory.name}`" in sources


def test_llama_3_1_8b_gqa():
    # 32 layers x (K and V) x 8 KV heads x head_dim 4096/32 = 128 x 2 bytes (bfloat16)
    assert per_token("llama-3.1-8b-instruct") == 32 * 2 * 8 * 128 * BF16 == 131072
    # TP 2 divides the 8 KV heads: 4 per GPU
    assert per_token("llama-3.1-8b-instruct", tensor_parallel_size=2) == 32 * 2 * 4 * 128 * BF16
    # TP 16 > 8 KV heads: each GPU keeps one (replicated), not half of one
    assert per_token("llama-3.1-8b-instruct", tensor_parallel_size=16) == 32 * 2 * 1 * 128 * BF16
    # fp8 KV cache: one byte per element
    assert per_token("llama-3.1-8b-instruct", kv_cache_dtype="fp8") == 32 * 2 * 8 * 128 * 1
    assert (
        shape_from_config(config("llama-3.1-8b-instruct")).max_position == 131072
    )  # llama3 RoPE: not rescaled


def test_llama_3_1_70b():
    # 80 layers, 8 KV heads, head_dim 8192/64 = 128
    assert per_token("llama-3.1-70b-instruct") == 80 * 2 * 8 * 128 * BF16 == 327680
    assert per_token("llama-3.1-70b-instruct", tensor_parallel_size=4) == 80 * 2 * 2 * 128 * BF16


def test_qwen3_8b_float32_config_is_served_in_bfloat16():
    # the config says dtype float32; vLLM's "auto" downcasts float32 models to bfloat16
    assert per_token("qwen3-8b") == 36 * 2 * 8 * 128 * BF16 == 147456


def test_qwen3_32b_explicit_head_dim():
    # head_dim 128 is explicit; hidden/heads would give 5120/64 = 80, the wrong figure
    assert per_token("qwen3-32b") == 64 * 2 * 8 * 128 * BF16 == 262144
    assert per_token("qwen3-32b") != 64 * 2 * 8 * (5120 // 64) * BF16


def test_mistral_7b_v0_3_no_sliding_window():
    # sliding_window null: every layer is full attention
    assert per_token("mistral-7b-instruct-v0.3") == 32 * 2 * 8 * 128 * BF16
    shape = shape_from_config(config("mistral-7b-instruct-v0.3"))
    assert {layer.kind for layer in shape.layers} == {"full"} and shape.max_position == 32768


def test_gemma_3_27b_sliding_layers_and_groups():
    cfg = config("gemma-3-27b-it")["text_config"]
    shape = shape_from_config(config("gemma-3-27b-it"))
    # 62 layers; every 6th (i = 5, 11, ..., 59) is global: 10 full, 52 sliding with window 1024
    full = [i for i in range(62) if (i + 1) % 6 == 0]
    assert len(full) == 10
    assert [i for i, layer in enumerate(shape.layers) if layer.kind == "full"] == full
    assert (
        {layer.window for layer in shape.layers if layer.kind == "sliding"}
        == {cfg["sliding_window"]}
        == {1024}
    )
    # 16 KV heads x head_dim 128 (explicit; 5376/32 would be 168) x 2 x 2 bytes, 62 layers
    assert per_token("gemma-3-27b-it") == 62 * 2 * 16 * 128 * BF16 == 507904
    assert (
        shape.max_position == 131072
    )  # transformers' default; Gemma 3's linear RoPE factor is not reapplied
    layout = kv_layout(
        shape, EngineSettings(block_size=16, max_num_batched_tokens=2048, async_scheduling=True)
    )
    # group size = min(10, 52) = 10; the 52 sliding layers deal into cdiv(52, 10) = 6 groups (9,9,9,9,8,8)
    assert sorted(g.layers for g in layout.groups if g.kind == "sliding") == [8, 8, 9, 9, 9, 9]
    assert layout.bytes_per_block == 10 * 16 * (2 * 16 * 128 * BF16) == 1310720
    # a 131072-token request: 131072/16 blocks for the full group; each sliding group keeps
    # cdiv(min(1024 - 1 + 2 x 2048, 131072), 16) + 1 = 320 + 1 blocks
    assert layout.blocks_per_request(131072) == 131072 // 16 + 6 * (-(-(1023 + 4096) // 16) + 1) == 10118


def test_deepseek_v3_mla():
    # MLA: one latent head of kv_lora_rank 512 + qk_rope_head_dim 64, no separate V, 61 layers
    assert per_token("deepseek-v3") == 61 * (512 + 64) * BF16 == 70272
    # TP does not divide the latent head
    assert per_token("deepseek-v3", tensor_parallel_size=8) == 70272
    assert per_token("deepseek-v3", kv_cache_dtype="fp8") == 61 * (512 + 64)
    # yarn keeps max_position_embeddings as the scaled length
    assert shape_from_config(config("deepseek-v3")).max_position == 163840


def test_gpt_oss_20b_alternating_window():
    shape = shape_from_config(config("gpt-oss-20b"))
    # layer_types alternate sliding (window 128) and full: 12 of each; 8 KV heads x head_dim 64
    assert sum(1 for x in shape.layers if x.kind == "sliding") == 12
    assert per_token("gpt-oss-20b") == 24 * 2 * 8 * 64 * BF16 == 49152
    layout = kv_layout(shape, EngineSettings(block_size=16))
    assert layout.bytes_per_block == 12 * 16 * (2 * 8 * 64 * BF16)
    assert len(layout.groups) == 2


def test_capacity_and_largest_context_llama_8b():
    # 10 GiB of KV cache; a block holds 16 tokens of 32 layers x 2 x 8 x 128 x 2 B = 2 MiB
    kv = 10 * GIB
    memory = Memory(0, 1.0, "--kv-cache-memory", kv)
    plan = plan_model(
        "llama", config("llama-3.1-8b-instruct"), None, memory, max_model_len=8192, typical_len=2048
    )
    blocks = kv // (32 * 16 * 2 * 8 * 128 * BF16)
    assert blocks == 5120
    # concurrency at 8192 tokens = 5120 / (8192/16) = 10.0; vLLM logs int(10.0 x 8192) tokens
    assert plan.max_concurrency == pytest.approx(10.0) and plan.kv_cache_tokens == 81920
    # the largest context: one request needs cdiv(L, 16) blocks of the 5120 - 1 (null block) usable
    assert plan.max_model_len == (blocks - 1) * 16 == 81904
    # sequences of 2048 tokens: (5120 - 1) // (2048 / 16)
    assert plan.max_num_seqs == (blocks - 1) // 128 == 39
    assert plan.fits is True


def test_full_context_does_not_fit_and_remedies_in_order():
    memory = Memory(0, 1.0, "--kv-cache-memory", 10 * GIB)
    plan = plan_model("llama", config("llama-3.1-8b-instruct"), None, memory)
    assert plan.fits is False  # 131072 tokens need 8192 blocks of the 5119 usable
    actions = [r.action for r in plan.remedies]
    assert actions[0] == "shorter context" and plan.remedies[0].flag == "--max-model-len 81904"
    assert actions[1] == "fp8 KV cache"
    # fp8 halves the page: 10240 blocks, 10239 usable >= 8192 needed
    assert plan.remedies[1].fits is True
    assert "tensor parallelism over 2 GPUs" in actions


def test_weights_that_do_not_fit_lead_to_quantised_and_tp_remedies():
    # Llama 3.1 70B in bf16 is about 141 GB; one 48 GiB GPU cannot hold it
    weights = 141_107_412_992
    plan = plan_model(
        "llama70",
        config("llama-3.1-70b-instruct"),
        weights,
        Memory(48 * GIB, 0.92, "--memory"),
        max_model_len=8192,
    )
    assert plan.fits is False and plan.kv_cache_bytes is not None and plan.kv_cache_bytes < 0
    actions = [r.action for r in plan.remedies]
    assert actions.index("fp8 KV cache") < actions.index("a 4-bit quantised variant (AWQ/GPTQ)")
    tp = [r for r in plan.remedies if r.action.startswith("tensor parallelism")]
    assert tp and tp[-1].fits  # some TP size makes 141 GB fit in 48 GiB GPUs
    assert tp[-1].flag in ("--tensor-parallel-size 4", "--tensor-parallel-size 8")


def test_no_memory_keeps_model_figures_and_nulls_the_rest():
    plan = plan_model("q", config("qwen3-32b"), 65 * GIB, None, memory_null_reason="no AMD GPU found")
    doc = plan.to_json()
    assert doc["kv_bytes_per_token"] == 262144 and doc["weights_bytes"] == 65 * GIB
    assert doc["kv_cache_tokens"] is None and doc["fits"] is None and doc["null_reason"] == "no AMD GPU found"


@pytest.mark.parametrize(
    "bad, message",
    [
        ({}, "num_hidden_layers"),
        ({"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": "big"}, "hidden_size"),
        ({"num_hidden_layers": -1, "num_attention_heads": 2, "hidden_size": 8}, "num_hidden_layers"),
        (
            {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 8, "torch_dtype": "int3"},
            "dtype",
        ),
        ([1, 2], "JSON object"),
        (
            {
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "hidden_size": 8,
                "layer_types": ["sliding_attention"] * 2,
            },
            "sliding_window",
        ),
    ],
)
def test_bad_configs_say_which_field(bad, message):
    with pytest.raises(ConfigError, match=message):
        shape_from_config(bad)  # type: ignore[arg-type]


def test_server_settings_from_the_plan():
    from rocmdoctor.provision.server.plan_settings import settings_from_plan

    memory = Memory(0, 1.0, "--kv-cache-memory", 10 * GIB)
    cfg = config("llama-3.1-8b-instruct")
    # the model's 131072 tokens do not fit: --max-model-len 81904 (by hand above) and 10 sequences on an APU
    planned = settings_from_plan(
        plan_model("m", cfg, None, memory),
        user_max_model_len=None,
        user_max_num_seqs=None,
        max_num_seqs_cap=10,
    )
    assert planned.refusal is None
    flags = {flag: value for flag, value, _ in planned.settings}
    assert flags == {"--max-model-len": "81904", "--max-num-seqs": "10"}
    # the user's own length that does not fit is refused, with the remedies
    refused = settings_from_plan(
        plan_model("m", cfg, None, memory, max_model_len=131072),
        user_max_model_len=131072,
        user_max_num_seqs=None,
        max_num_seqs_cap=256,
    )
    assert refused.refusal and "--kv-cache-dtype fp8" in refused.refusal
    # weights larger than the GPU: nothing fits at all
    hopeless = plan_model("m", cfg, 40 * GIB, Memory(24 * GIB, 0.92, "--memory"))
    assert settings_from_plan(
        hopeless, user_max_model_len=None, user_max_num_seqs=None, max_num_seqs_cap=256
    ).refusal
