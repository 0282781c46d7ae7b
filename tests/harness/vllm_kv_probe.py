"""vLLM's own KV cache arithmetic for model configs, without starting an engine.

Run with the vLLM venv's interpreter: `python vllm_kv_probe.py < cases.json`, where each case is
{"model_dir", "max_model_len", "kv_bytes", "block_size", "kv_cache_dtype"}. vLLM's ModelConfig (built by
EngineArgs.create_engine_config) gives the KV heads per GPU, the head size, MLA and the layer types;
vLLM's kv_cache_interface specs and kv_cache_utils functions (get_kv_cache_configs,
get_kv_cache_capacity) give the blocks, the capacity and the start-up check with its estimated length.
Prints one JSON object per case, in order, as a JSON list.
"""

from __future__ import annotations

import json
import os
import re
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def probe(case: dict) -> dict:
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.core import kv_cache_utils as ku
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec

    block, kv_dtype = case["block_size"], case["kv_cache_dtype"]
    args = EngineArgs(
        model=case["model_dir"],
        max_model_len=case["max_model_len"],
        block_size=block,
        skip_tokenizer_init=True,
        load_format="dummy",
        max_num_batched_tokens=2048,
        enforce_eager=True,
        kv_cache_dtype=kv_dtype,
    )
    cfg = args.create_engine_config()
    # The engine core resolves the layout at start-up; for uniform pages every layout gives the same blocks.
    cfg.cache_config.kv_cache_layout = "LBNHC"
    mc = cfg.model_config
    dtype = mc.dtype if kv_dtype == "auto" else torch.float8_e4m3fn
    heads, head = mc.get_num_kv_heads(cfg.parallel_config), mc.get_head_size()
    layers = mc.get_num_layers(cfg.parallel_config)
    types = getattr(mc.hf_text_config, "layer_types", None) or ["full_attention"] * layers
    window = getattr(mc.hf_text_config, "sliding_window", None)
    specs = {}
    for i, kind in enumerate(types[:layers]):
        if mc.use_mla:
            specs[f"layers.{i}"] = MLAAttentionSpec(
                block_size=block, num_kv_heads=1, head_size=head, dtype=dtype, cache_dtype_str=kv_dtype
            )
        elif kind == "sliding_attention":
            specs[f"layers.{i}"] = SlidingWindowSpec(
                block_size=block, num_kv_heads=heads, head_size=head, dtype=dtype, sliding_window=window
            )
        else:
            specs[f"layers.{i}"] = FullAttentionSpec(
                block_size=block, num_kv_heads=heads, head_size=head, dtype=dtype
            )
    out = {
        "kv_heads": heads,
        "head_size": head,
        "mla": bool(mc.use_mla),
        "layers": layers,
        "max_in_flight_tokens": cfg.max_in_flight_tokens,
    }
    try:
        configs = ku.get_kv_cache_configs(cfg, [specs], [case["kv_bytes"]])
        tokens, concurrency = ku.get_kv_cache_capacity(cfg, ku.generate_scheduler_kv_cache_config(configs))
        out.update(fits=True, tokens=tokens, concurrency=concurrency)
    except ValueError as exc:
        found = re.search(r"estimated maximum model length is (\d+)", str(exc))
        out.update(fits=False, estimated=int(found[1]) if found else 0, error=str(exc)[:300])
    return out


if __name__ == "__main__":
    print(json.dumps([probe(case) for case in json.load(sys.stdin)]))
