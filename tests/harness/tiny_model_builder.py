"""Write a tiny random-weight model directory: config.json plus a byte-level BPE tokenizer.

Run with the vLLM venv's interpreter (transformers and tokenizers live there, not in the project
venv): `python tiny_model_builder.py OUT_DIR HEAD_DIM [ARCH]`. No weights are written: the engine serves
it with `--load-format dummy`. Everything is offline and deterministic.

ARCH (default `llama`) picks one of the attention layouts `rocmdoctor plan` must get right:
llama (GQA 4:2), qwen3 (explicit head_dim unlike hidden/heads), gemma3 (sliding-window layers with
one global layer in six), deepseek (MLA latent cache), oddgqa (6 query heads over 2 KV heads:
an odd factor of 3), granitehybrid (Granite-4.0-H: 3 Mamba2 layers per attention layer),
qwen3next / qwen3next-types (Qwen3-Next: 3 gated-delta-net linear-attention layers per full-attention
layer, spelt as full_attention_interval or as layer_types) and cohere2 / cohere2-types (Command R7B:
3 sliding layers per full one, spelt as sliding_window_pattern or as layer_types), lfm2 (LFM2: 3
short-conv layers per attention layer) and jamba (Jamba: 3 Mamba1 layers per attention layer).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
HIDDEN_SIZE = 128
HEADS = 2
KV_HEADS = 1
LAYERS = 2
MAX_POSITIONS = 512


def training_corpus() -> list[str]:
    """Plain English about serving models, enough for a few hundred BPE merges."""
    subjects = ["The server", "A request", "The model", "Each token", "The scheduler", "The GPU", "A user"]
    verbs = ["answers", "streams", "measures", "waits for", "returns", "counts", "sends"]
    objects = ["the prompt", "one chunk", "every reply", "the latency", "a batch of work", "the next word"]
    tails = [
        "quickly.",
        "in order.",
        "without errors.",
        "under load.",
        "at 8000 tokens per second.",
        "again.",
    ]
    lines = []
    for i, subject in enumerate(subjects):
        for j, verb in enumerate(verbs):
            obj = objects[(i + j) % len(objects)]
            tail = tails[(i * 3 + j) % len(tails)]
            lines.append(f"{subject} {verb} {obj} {tail} Step {i * 10 + j}: hello, world!")
    return lines


def arch_config(arch: str, head_dim: int) -> dict:
    """The architecture-specific part of config.json (the common fields come from build())."""
    if arch == "llama":
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": HIDDEN_SIZE,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "head_dim": head_dim,
            "num_hidden_layers": LAYERS,
            "max_position_embeddings": MAX_POSITIONS,
        }
    if arch == "qwen3":
        # head_dim 64 with hidden 128 over 4 heads: hidden/heads (32) would be wrong
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "hidden_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": head_dim,
            "num_hidden_layers": 3,
            "max_position_embeddings": 4096,
            "use_sliding_window": False,
            "sliding_window": None,
        }
    if arch == "gemma3":
        # 6 layers, Gemma 3's pattern: 5 sliding (window 128) then 1 global
        return {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "hidden_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": head_dim,
            "num_hidden_layers": 6,
            "max_position_embeddings": 4096,
            "sliding_window": 128,
            "sliding_window_pattern": 6,
            "query_pre_attn_scalar": head_dim,
            "hidden_activation": "gelu_pytorch_tanh",
            "rope_local_base_freq": 10000.0,
        }
    if arch == "deepseek":
        # MLA with DeepSeek-V3's latent sizes; no MoE (every layer dense)
        return {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "hidden_size": 256,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "num_hidden_layers": 2,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "v_head_dim": 128,
            "q_lora_rank": None,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "first_k_dense_replace": 2,
            "moe_layer_freq": 1,
            "n_group": 1,
            "topk_group": 1,
            "max_position_embeddings": 4096,
            "rope_scaling": None,
        }
    if arch == "oddgqa":
        return {
            "architectures": ["MistralForCausalLM"],
            "model_type": "mistral",
            "hidden_size": 6 * head_dim,
            "num_attention_heads": 6,
            "num_key_value_heads": 2,
            "head_dim": head_dim,
            "num_hidden_layers": 3,
            "max_position_embeddings": 4096,
            "sliding_window": None,
        }
    if arch == "granitehybrid":
        # Granite-4.0-H's layout, tiny: layers 0-2 Mamba2, layer 3 attention; dense MLP (no experts)
        return {
            "architectures": ["GraniteMoeHybridForCausalLM"],
            "model_type": "granitemoehybrid",
            "hidden_size": 128,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "num_hidden_layers": 4,
            "layer_types": ["mamba", "mamba", "mamba", "attention"],
            "mamba_n_heads": 4,
            "mamba_d_head": 64,
            "mamba_d_state": 64,
            "mamba_n_groups": 1,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_chunk_size": 64,
            "num_local_experts": 0,
            "shared_intermediate_size": 256,
            "position_embedding_type": "rope",
            "max_position_embeddings": 4096,
        }
    if arch in ("qwen3next", "qwen3next-types"):
        # Qwen3-Next's layout, tiny: linear, linear, linear, full (x2); a few small experts
        pattern = (
            {"full_attention_interval": 4}
            if arch == "qwen3next"
            else {
                "layer_types": ["linear_attention"] * 3
                + ["full_attention"]
                + ["linear_attention"] * 3
                + ["full_attention"]
            }
        )
        return {
            "architectures": ["Qwen3NextForCausalLM"],
            "model_type": "qwen3_next",
            "hidden_size": 128,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": head_dim,
            "num_hidden_layers": 8,
            **pattern,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 32,
            "linear_value_head_dim": 32,
            "linear_conv_kernel_dim": 4,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64,
            "decoder_sparse_step": 1,
            "partial_rotary_factor": 0.25,
            "max_position_embeddings": 4096,
        }
    if arch in ("cohere2", "cohere2-types"):
        # Command R7B's layout, tiny: sliding, sliding, sliding, full (x2), window 128
        pattern = (
            {"sliding_window_pattern": 4}
            if arch == "cohere2"
            else {"layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 2}
        )
        return {
            "architectures": ["Cohere2ForCausalLM"],
            "model_type": "cohere2",
            "hidden_size": 128,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": head_dim,
            "num_hidden_layers": 8,
            **pattern,
            "sliding_window": 128,
            "logit_scale": 0.0625,
            "layer_norm_eps": 1e-5,
            "max_position_embeddings": 4096,
        }
    if arch == "lfm2":
        # LFM2's layout, tiny: three short-conv layers, then attention (full_attn_idxs)
        return {
            "architectures": ["Lfm2ForCausalLM"],
            "model_type": "lfm2",
            "hidden_size": 128,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "num_hidden_layers": 4,
            "full_attn_idxs": [3],
            "conv_dim": 128,
            "block_dim": 128,
            "conv_L_cache": 3,
            "conv_bias": False,
            "block_auto_adjust_ff_dim": False,
            "norm_eps": 1e-5,
            "max_position_embeddings": 4096,
        }
    if arch == "jamba":
        # Jamba's layout, tiny: three Mamba1 layers, then attention (attn_layer_period/offset); dense MLP
        return {
            "architectures": ["JambaForCausalLM"],
            "model_type": "jamba",
            "hidden_size": 128,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "num_hidden_layers": 4,
            "attn_layer_period": 4,
            "attn_layer_offset": 3,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "num_experts": 1,
            "num_experts_per_tok": 1,
            "mamba_d_state": 16,
            "mamba_d_conv": 4,
            "mamba_expand": 2,
            "mamba_dt_rank": 8,
            "use_mamba_kernels": False,
            "max_position_embeddings": 4096,
        }
    raise SystemExit(f"unknown architecture {arch!r}")


def build(out: Path, head_dim: int, arch: str = "llama") -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(training_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>"
    )
    fast.chat_template = CHAT_TEMPLATE
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    specific = arch_config(arch, head_dim)
    config = {
        **specific,
        "intermediate_size": 2 * specific["hidden_size"],
        # Exactly the tokenizer's size: a larger vocabulary lets random weights pick ids that
        # decode to nothing.
        "vocab_size": len(fast),
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
        "bos_token_id": fast.bos_token_id,
        "eos_token_id": fast.eos_token_id,
        "pad_token_id": fast.pad_token_id,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    build(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "llama")
