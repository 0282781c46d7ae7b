"""One vLLM version's own KV-cache arithmetic on hand-built layer specs, for the plan's version rules.

Run with the engine venv's interpreter and that version's pure-Python tree first on PYTHONPATH (the
sources tests/setup/35-vllm-sources.sh unpacks, with the gguf and diskcache modules the older trees
import): `python vllm_version_kv.py < cases.json`. Each case gives the layers ("full" | "sliding" | "chunked"),
their KV heads, head size, window, block size, max_model_len, max_num_batched_tokens and the KV bytes.
The version's own `get_kv_cache_configs` (grouping, the start-up check), `get_max_concurrency_for_kv_cache_config`
and its `GPU KV cache size: N tokens` log line answer. The config is a strict record of the fields these
functions read: a field a version reads that is not given fails the probe (0.32 reads
`VllmConfig.max_in_flight_tokens`, a property of the real config: 0.32 is checked by the real engine in
tests/system/test_plan_engine.py instead). Prints {"vllm": its version, "results": one object per case}.
"""

from __future__ import annotations

import json
import logging
import re
import sys


class Strict:
    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __getattr__(self, name):
        raise AttributeError(f"the probe gives no config field {name!r}")


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def probe(case: dict, lines: Lines) -> dict:
    import torch
    from vllm import logger as vllm_logger
    from vllm.v1.core import kv_cache_utils as ku
    from vllm.v1.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec, SlidingWindowSpec

    cfg = Strict(
        model_config=Strict(
            max_model_len=case["max_model_len"], original_max_model_len=case["max_model_len"]
        ),
        scheduler_config=Strict(
            max_num_batched_tokens=case["max_num_batched_tokens"],
            async_scheduling=True,
            disable_hybrid_kv_cache_manager=False,
        ),
        parallel_config=Strict(
            decode_context_parallel_size=1, prefill_context_parallel_size=1, pipeline_parallel_size=1
        ),
        cache_config=Strict(num_gpu_blocks_override=None),
        kv_transfer_config=None,
    )
    specs = {}
    for i, kind in enumerate(case["layers"]):
        common = {
            "block_size": case["block_size"],
            "num_kv_heads": case["kv_heads"],
            "head_size": case["head_size"],
            "dtype": torch.bfloat16,
        }
        if kind == "sliding":
            spec = SlidingWindowSpec(sliding_window=case["window"], **common)
        elif kind == "chunked":
            spec = ChunkedLocalAttentionSpec(attention_chunk_size=case["window"], **common)
        else:
            spec = FullAttentionSpec(**common)
        specs[f"model.layers.{i}.self_attn.attn"] = spec
    lines.lines.clear()
    once = getattr(vllm_logger, "_print_info_once", None)
    if once is not None:  # vLLM logs the capacity once per distinct line: a repeated figure must log again
        once.cache_clear()
    try:
        (config,) = ku.get_kv_cache_configs(cfg, [specs], [case["kv_bytes"]])
    except ValueError as exc:
        return {"fits": False, "error": str(exc)[:300]}
    concurrency = ku.get_max_concurrency_for_kv_cache_config(cfg, config)
    logged = next((m for m in lines.lines if "KV cache size" in m), "")
    tokens = re.search(r"KV cache size: ([\d,]+) tokens", logged)
    return {
        "fits": True,
        "num_blocks": config.num_blocks,
        "concurrency": concurrency,
        "tokens": int(tokens[1].replace(",", "")) if tokens else None,
    }


if __name__ == "__main__":
    import vllm
    from vllm.v1.core import kv_cache_utils

    lines = Lines()
    kv_cache_utils.logger.addHandler(lines)
    kv_cache_utils.logger.setLevel(logging.INFO)
    cases = json.load(sys.stdin)
    print(json.dumps({"vllm": vllm.__version__, "results": [probe(case, lines) for case in cases]}))
