"""The plan's version rules (src/rocmdoctor/vllm/plan_versions.py) against each bundled vLLM's own code:
the pure-Python tree of 0.19.1, 0.20.1, 0.22.1 and 0.25.1 (tests/setup/35-vllm-sources.sh) imported by the
engine venv's interpreter (tests/harness/vllm_version_kv.py), no engine started. Each version's own
`get_kv_cache_configs`, `get_max_concurrency_for_kv_cache_config` and `GPU KV cache size` log line
answer for sliding-window and chunked-local layouts; the plan at that version must give the same blocks, concurrency,
tokens and start-up verdict. 0.32 is the real engine's (tests/system/test_plan_engine.py)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import REPO
from harness.engine import require_vllm_python
from harness.engine import test_cache as cache_root
from rocmdoctor.vllm.memory_plan import EngineSettings, Memory, kv_layout, plan_model, shape_from_config

pytestmark = pytest.mark.engine  # the vLLM venv's interpreter; ~15 s of imports per version

PROBE = REPO / "tests" / "harness" / "vllm_version_kv.py"
OLDER = ("0.19.1", "0.20.1", "0.22.1", "0.25.1")
GEMMA2 = ["sliding", "full"] * 2  # 2 KV heads of 64: a layer's page is 8192 B, a block 16384 B
GEMMA3 = (["sliding"] * 5 + ["full"]) * 2  # 5 local : 1 global, padded groups
LLAMA4 = ["chunked"] * 3 + ["full"]  # chunked-local attention (attention_chunk_size) and a global layer
# (layers, KV heads, head size, window, max_model_len, KV bytes)
CASES = [
    (GEMMA2, 2, 64, 512, 8192, 64 << 20),
    (GEMMA2, 2, 64, 512, 8192, 673 * 16384),  # one request exactly: 512 + cdiv(511 + 2048, 16) + 1 blocks
    (GEMMA2, 2, 64, 512, 8192, 672 * 16384),  # one block short
    (GEMMA3, 4, 128, 1024, 32768, 1 << 30),
    (GEMMA3, 4, 128, 1024, 32768, 40 << 20),
    (LLAMA4, 2, 64, 1024, 32768, 64 << 20),
    (["full"], 2, 64, 512, 8192, 512 * 8192),  # exactly one request: no null block held back before 0.32
]


def config_of(layers, kv_heads, head, window, length) -> dict:
    chunked = "chunked" in layers
    names = {"sliding": "sliding_attention", "chunked": "chunked_attention", "full": "full_attention"}
    return {
        "architectures": ["Llama4ForCausalLM" if chunked else "Gemma3ForCausalLM"],
        "model_type": "llama4_text" if chunked else "gemma3_text",
        "num_hidden_layers": len(layers),
        "num_attention_heads": 8,
        "num_key_value_heads": kv_heads,
        "head_dim": head,
        "hidden_size": 512,
        "max_position_embeddings": length,
        ("attention_chunk_size" if chunked else "sliding_window"): window,
        "layer_types": [names[k] for k in layers],
        "torch_dtype": "bfloat16",
    }


def ask(version: str) -> dict:
    python = require_vllm_python()
    tree = cache_root() / "vllm-sources"
    assert (tree / version / "vllm" / "__init__.py").is_file(), (
        f"no vLLM {version} sources under {tree}: run tests/setup/35-vllm-sources.sh (tests/run does)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        PYTHONPATH=f"{tree / version}:{tree / 'deps'}",
        VLLM_LOGGING_LEVEL="INFO",
        VLLM_NO_USAGE_STATS="1",
        PYTHONWARNINGS="ignore",
    )
    cases = [
        {
            "layers": layers,
            "kv_heads": heads,
            "head_size": head,
            "window": window,
            "max_model_len": length,
            "max_num_batched_tokens": 2048,
            "block_size": 16,
            "kv_bytes": kv,
        }
        for layers, heads, head, window, length, kv in CASES
    ]
    done = subprocess.run(
        [str(python), str(PROBE)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("version", OLDER)
def test_the_plan_at_each_bundled_version_equals_that_versions_own_code(version):
    answer = ask(version)
    assert answer["vllm"] == version
    for (layers, heads, head, window, length, kv), got in zip(CASES, answer["results"], strict=True):
        config = config_of(layers, heads, head, window, length)
        settings = EngineSettings(vllm_version=version)  # async scheduling on, as unit/serve plan
        plan = plan_model("m", config, 1, Memory(0, 1.0, "--kv-cache-memory", kv), settings=settings)
        case = f"{version} {len(layers)} layers, {kv} B"
        assert plan.fits == got["fits"], (case, got)
        if got["fits"]:
            assert kv_layout(shape_from_config(config), settings).num_blocks(kv) == got["num_blocks"], case
            assert plan.max_concurrency == got["concurrency"], case
            assert plan.kv_cache_tokens == got["tokens"], case
    # the 0.32 rules differ on the first case (two batches beyond the window): the versions are told apart
    first = Memory(0, 1.0, "--kv-cache-memory", CASES[0][5])
    newest = plan_model("m", config_of(*CASES[0][:5]), 1, first)
    assert newest.max_concurrency != answer["results"][0]["concurrency"]
