"""Tiny configs of the architectures the plan's second engine round covers (issue 37), in the
spellings their Hub configs use and the ones transformers 5 re-saves. Each is a dict of config.json
keys beyond the tiny llama model's (its tokenizer, vocabulary and dtype); the engine serves it with
`--load-format dummy`. Sizes are the smallest the CPU engine takes: head sizes of 64 and 128, a few
layers, small experts. The Hub spelling each one mirrors is named beside it.
"""

from __future__ import annotations

COMMON = {"hidden_size": 128, "num_attention_heads": 2, "max_position_embeddings": 4096, "head_dim": 64}

ARCHS: dict[str, dict] = {
    # openbmb/MiniCPM3-4B: kv_lora_rank with ordinary attention (vLLM minicpm3.py)
    "minicpm3": {
        **COMMON,
        "architectures": ["MiniCPM3ForCausalLM"],
        "model_type": "minicpm3",
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "q_lora_rank": 64,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 32,
        "v_head_dim": 64,
        "scale_emb": 1,
        "dim_model_base": 128,
        "scale_depth": 1.4,
    },
    # arcee-ai/AFM-4.5B-style afmoe, Hub spelling: global_attn_every_n_layers, no layer_types
    "afmoe-hub": {
        **COMMON,
        "architectures": ["AfmoeForCausalLM"],
        "model_type": "afmoe",
        "num_key_value_heads": 1,
        "num_hidden_layers": 8,
        "global_attn_every_n_layers": 4,
        "sliding_window": 128,
        "num_dense_layers": 1,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_shared_experts": 1,
        "moe_intermediate_size": 64,
        "score_func": "sigmoid",
        "route_norm": True,
        "route_scale": 1.0,
        "n_group": 1,
        "topk_group": 1,
    },
    # the same afmoe re-saved by transformers 5: layer_types written out
    "afmoe-resaved": {
        **COMMON,
        "architectures": ["AfmoeForCausalLM"],
        "model_type": "afmoe",
        "num_key_value_heads": 1,
        "num_hidden_layers": 8,
        "global_attn_every_n_layers": 4,
        "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 2,
        "sliding_window": 128,
        "num_dense_layers": 1,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_shared_experts": 1,
        "moe_intermediate_size": 64,
        "score_func": "sigmoid",
        "route_norm": True,
        "route_scale": 1.0,
        "n_group": 1,
        "topk_group": 1,
    },
    # EXAONE 4 Hub spelling: sliding_window_pattern "LLLG" beside layer_types
    "exaone4-hub": {
        **COMMON,
        "architectures": ["Exaone4ForCausalLM"],
        "model_type": "exaone4",
        "num_key_value_heads": 1,
        "num_hidden_layers": 8,
        "sliding_window": 128,
        "sliding_window_pattern": "LLLG",
        "layer_types": (["sliding_attention"] * 3 + ["full_attention"]) * 2,
    },
    # EXAONE 4 re-saved by transformers 5: sliding_window_pattern an int
    "exaone4-int": {
        **COMMON,
        "architectures": ["Exaone4ForCausalLM"],
        "model_type": "exaone4",
        "num_key_value_heads": 1,
        "num_hidden_layers": 8,
        "sliding_window": 128,
        "sliding_window_pattern": 4,
    },
    # stepfun-ai/Step-3.5-Flash: KV heads spelt num_attention_groups; sliding layers with their own
    # heads and head size (attention_other_setting)
    "step3p5": {
        **COMMON,
        "architectures": ["Step3p5ForCausalLM"],
        "model_type": "step3p5",
        "num_attention_heads": 4,
        "num_attention_groups": 1,
        "num_hidden_layers": 4,
        "max_seq_len": 4096,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "attention_other_setting": {
            "attention_type": "sliding_attention",
            "num_attention_heads": 4,
            "num_attention_groups": 2,
            "head_dim": 64,
            "true_head_dim": 64,
        },
        "use_moe": False,
    },
    # google/gemma-4 (31B shape): full-attention layers with global_head_dim and their own KV heads
    "gemma4": {
        **COMMON,
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "num_key_value_heads": 2,
        "num_hidden_layers": 6,
        "sliding_window": 128,
        "global_head_dim": 128,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 512,
    },
    # the same Gemma 4 re-saved by transformers 5: the global layers as per_layer_config
    "gemma4-resaved": {
        **COMMON,
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "num_key_value_heads": 2,
        "num_hidden_layers": 6,
        "sliding_window": 128,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "attention_k_eq_v": True,
        "per_layer_config": {"5": {"head_dim": 128, "num_key_value_heads": 1}},
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 512,
    },
    # google/gemma-4-E2B shape: the last layers share the KV cache of earlier ones
    "gemma4-shared": {
        **COMMON,
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "num_key_value_heads": 1,
        "num_hidden_layers": 10,
        "sliding_window": 128,
        "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 2,
        "global_head_dim": 128,
        "num_kv_shared_layers": 4,
        "hidden_size_per_layer_input": 16,
        "vocab_size_per_layer_input": 512,
    },
    # google/gemma-3n-E2B: per-layer intermediate_size, KV sharing
    "gemma3n": {
        **COMMON,
        "architectures": ["Gemma3nForCausalLM"],
        "model_type": "gemma3n_text",
        "num_key_value_heads": 1,
        "num_hidden_layers": 10,
        "intermediate_size": [256] * 10,
        "sliding_window": 128,
        "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 2,
        "num_kv_shared_layers": 4,
        "hidden_size_per_layer_input": 16,
        "vocab_size_per_layer_input": 512,
        "laurel_rank": 8,
        "altup_num_inputs": 2,
        "activation_sparsity_pattern": [0.0] * 10,
    },
    # Nemotron-H re-saved by transformers 5: layers_block_type, no num_hidden_layers
    "nemotronh-resaved": {
        **COMMON,
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "num_key_value_heads": 1,
        "layers_block_type": ["mamba", "mlp", "mamba", "attention"],
        "mamba_num_heads": 4,
        "mamba_head_dim": 32,
        "ssm_state_size": 16,
        "n_groups": 1,
        "conv_kernel": 4,
        "expand": 1,
        "chunk_size": 64,
    },
}
# Refused cleanly by the plan (the CPU engine may or may not load them).
REFUSED: dict[str, dict] = {
    # moonshotai/Kimi-Linear-48B-A3B: KDA linear-attention layers (linear_attn_config) beside MLA
    "kimi-linear": {
        **COMMON,
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "num_hidden_layers": 4,
        "kv_lora_rank": 64,
        "qk_rope_head_dim": 32,
        "qk_nope_head_dim": 32,
        "v_head_dim": 64,
        "linear_attn_config": {
            "kda_layers": [1, 2, 3],
            "full_attn_layers": [4],
            "num_heads": 2,
            "head_dim": 64,
        },
    },
    # Zyphra/Zamba2: Mamba2 layers with shared attention blocks, state size not modelled
    "zamba2": {
        **COMMON,
        "architectures": ["Zamba2ForCausalLM"],
        "model_type": "zamba2",
        "num_hidden_layers": 4,
        "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"],
    },
}
