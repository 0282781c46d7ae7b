"""A tiny Llama with seeded random weights written to safetensors, for probes that need decisive logits.

vLLM's `--load-format dummy` fills every weight from U(-1e-3, 1e-3), so the shared engine's logits
are flat: every next token is a tie within 1e-6 (measured: all top-2 log-probabilities equal to 6
decimals), and no probe that compares two computation paths can tell a right answer from a wrong
one on it. Weights drawn from N(0, 1/fan_in) give a random but decisive model: greedy tokens win by
whole nats, and a context cut short changes them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from harness.engine import make_tiny_model, vllm_python

# Runs on the engine's interpreter (torch and safetensors are vLLM's own dependencies).
_WRITER = r"""
import json, sys
import torch
from safetensors.torch import save_file
out = sys.argv[1]
config = json.load(open(f"{out}/config.json"))
# Untied: with tied embeddings the input token's own embedding dominates its logit and the model
# only ever repeats the last token.
config["tie_word_embeddings"] = False
json.dump(config, open(f"{out}/config.json", "w"), indent=2)
gen = torch.Generator().manual_seed(38)
hidden, inter = config["hidden_size"], config["intermediate_size"]
heads, kv, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
def w(rows, cols):
    return (torch.randn(rows, cols, generator=gen) / cols ** 0.5).to(torch.bfloat16)
tensors = {"model.embed_tokens.weight": torch.randn(config["vocab_size"], hidden, generator=gen).to(torch.bfloat16),
           "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
           # logits with a spread of a few nats: decisive, yet far from one-hot
           "lm_head.weight": (torch.randn(config["vocab_size"], hidden, generator=gen) * 3 / hidden ** 0.5).to(torch.bfloat16)}
for i in range(config["num_hidden_layers"]):
    p = f"model.layers.{i}."
    tensors |= {
        p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        p + "self_attn.q_proj.weight": w(heads * head_dim, hidden),
        p + "self_attn.k_proj.weight": w(kv * head_dim, hidden),
        p + "self_attn.v_proj.weight": w(kv * head_dim, hidden),
        p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
        p + "mlp.gate_proj.weight": w(inter, hidden),
        p + "mlp.up_proj.weight": w(inter, hidden),
        p + "mlp.down_proj.weight": w(hidden, inter),
    }
save_file(tensors, f"{out}/model.safetensors")
"""

# Serve the written weights, not dummy ones (the engine's argv is parsed last-wins).
LOAD_REAL_WEIGHTS = ("--load-format", "safetensors")


def make_weighted_tiny_model(dest: Path) -> Path:
    """The shared tiny Llama's config and tokenizer, plus seeded N(0, 1/fan_in) weights."""
    make_tiny_model(dest)
    subprocess.run(
        [str(vllm_python()), "-c", _WRITER, str(dest)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    return dest
