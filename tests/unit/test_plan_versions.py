"""The plan's rules by the vLLM version that serves (src/rocmdoctor/vllm/plan_versions.py), each figure
worked by hand from that version's own sources (vllm/v1/kv_cache_interface.py, kv_cache_utils.py)."""

from __future__ import annotations

import pytest

from rocmdoctor.vllm.memory_plan import ConfigError, EngineSettings, Memory, plan_model
from rocmdoctor.vllm.plan_versions import KNOWN_VERSIONS, release_of, rules_for

# Gemma 2 shape: 4 layers, sliding (window 512) and full alternating, 2 KV heads of 64, bfloat16.
# One layer's page: 16 tokens x 2 heads x (64 + 64) x 2 B = 8192 B; two groups of 2 layers, so one block
# of the pool is 2 x 8192 = 16384 B and 64 MiB of KV cache holds 4096 blocks.
SLIDING = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "hidden_size": 256,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 8192,
    "sliding_window": 512,
    "torch_dtype": "bfloat16",
}
KV = Memory(0, 1.0, "--kv-cache-memory", 64 << 20)


def plan_at(version: str, config: dict = SLIDING, **settings):
    return plan_model("m", config, 10, KV, settings=EngineSettings(vllm_version=version, **settings))


def test_0_32_keeps_two_batches_beyond_the_window_with_async_scheduling():
    # full: cdiv(8192, 16) = 512 blocks; sliding: cdiv(min(511 + 2 x 2048, 8192), 16) + 1 = 289.
    # 4096 / 801 = 5.1136x; N = int(5.1136 x 8192) = 41890 (get_kv_cache_capacity).
    plan = plan_at("0.32.0")
    assert plan.kv_cache_tokens == 41890
    assert round(plan.max_concurrency, 4) == round(4096 / 801, 4)
    # max-num-seqs at 4096 tokens: 256 + cdiv(4096, 16) + 1 = 513 blocks each, of 4095 usable: 7.
    assert plan.max_num_seqs == 7


@pytest.mark.parametrize("version", ["0.20.1", "0.22.1", "0.25.1"])
def test_older_versions_keep_one_batch_whatever_the_scheduling(version):
    # SlidingWindowSpec.max_admission_blocks_per_request(max_num_batched_tokens): cdiv(511 + 2048, 16) + 1
    # = 161; 4096 / (512 + 161) = 6.0862x; N = int(6.0862 x 8192) = 49857: 0.32's plan is 16 % low here.
    for async_scheduling in (True, False):
        plan = plan_at(version, async_scheduling=async_scheduling)
        assert plan.kv_cache_tokens == 49857
        assert round(plan.max_concurrency, 4) == round(4096 / 673, 4)
        assert plan.max_num_seqs == 4095 // (256 + 161)
    assert any(f"vLLM {version} keeps one batch" in a for a in plan_at(version).assumptions)


def test_0_19_1_logs_tokens_from_the_block_count():
    # 0.19.1 _report_kv_cache_config: num_blocks // len(groups) x block size = 4096 // 2 x 16.
    plan = plan_at("0.19.1")
    assert plan.kv_cache_tokens == 32768
    assert round(plan.max_concurrency, 4) == round(4096 / 673, 4)


def test_the_null_block_counts_in_the_start_up_check_from_0_32_only():
    # A full-attention model: 1 layer, 2 heads of 64: page 8192 B. 8192 tokens need 512 blocks; with
    # exactly 512 blocks 0.32 refuses (the null block is held back) and 0.20.1 starts.
    config = {**SLIDING, "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1}
    config.pop("sliding_window")
    exact = Memory(0, 1.0, "--kv-cache-memory", 512 * 8192)
    new = plan_model("m", config, 10, exact, settings=EngineSettings(vllm_version="0.32.0"))
    old = plan_model("m", config, 10, exact, settings=EngineSettings(vllm_version="0.20.1"))
    assert (new.fits, new.max_model_len) == (False, 8192 - 16)
    assert (old.fits, old.max_model_len) == (True, 8192)


def test_layouts_not_modelled_for_a_version_are_refused():
    # Falcon-H1 (transformers FalconH1Config keys): state layers are planned for 0.32 only.
    state = {
        **SLIDING,
        "model_type": "falcon_h1",
        "architectures": ["FalconH1ForCausalLM"],
        "mamba_n_heads": 8,
        "mamba_d_head": 32,
        "mamba_d_state": 16,
        "mamba_d_ssm": 256,
    }
    assert plan_at("0.32.0", state).kv_cache_tokens
    with pytest.raises(ConfigError, match="for vLLM 0.20.1: .*recurrent-state"):
        plan_at("0.20.1", state)
    # Layers of two page sizes (Gemma 4's global layers, per-layer head sizes): 0.32 only.
    mixed = {
        **SLIDING,
        "model_type": "gemma4_text",
        "architectures": ["Gemma4ForCausalLM"],
        "global_head_dim": 128,
    }
    assert plan_at("0.32.0", mixed).kv_cache_tokens
    with pytest.raises(ConfigError, match="for vLLM 0.25.1: .*different page sizes"):
        plan_at("0.25.1", mixed)


def test_versions_are_read_by_release_and_unknown_ones_refused():
    assert release_of("0.20.1+rocm7.12.0") == "0.20.1" and rules_for("0.32") is rules_for("0.32.0")
    assert release_of("0.25.2.dev0+rocm7.15.0a20260724") is None
    with pytest.raises(ConfigError, match=r"vLLM 0\.33\.0: rocmdoctor knows .*0\.19\.1"):
        rules_for("0.33.0")
    assert KNOWN_VERSIONS[-1] == "0.32.0"


def test_the_plan_commands_choices_are_the_tables_versions():
    from rocmdoctor.commands.plan import VLLM_VERSIONS

    assert VLLM_VERSIONS == KNOWN_VERSIONS  # the CLI keeps its own tuple so that --help imports no plan code
