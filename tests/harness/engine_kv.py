"""vLLM's own KV-cache sizing of tiny models, read from its log: the plan's engine check.

`size_kv_caches` runs harness/kv_capacity.py in one interpreter of a vLLM environment (the suite's 0.32
venv, or a shipped version's from tests/bench/engine_versions.py) with a fixed 1 GiB CPU KV cache;
`capacity` reads vLLM's `GPU KV cache size: N tokens, Maximum concurrency ...` line from one case's log.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

from harness.engine import BUILDER, engine_env, vllm_python
from rocmdoctor.vllm.memory_plan import EngineSettings, Memory, ModelPlan, plan_model

# 0.32 logs one line; 0.20.1 and 0.22.1 two (kv_cache_utils.py: "GPU KV cache size: N tokens", then
# "Maximum concurrency for ... per request: Cx" on the next log record)
CAPACITY = re.compile(
    r"KV cache size: ([\d,]+) tokens(?:, |\n[^\n]*?)Maximum concurrency for ([\d,]+) tokens per "
    r"request: ([\d.]+)x"
)
KV_BYTES = 1 << 30  # VLLM_CPU_KVCACHE_SPACE=1: a fixed 1 GiB KV cache
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
KV_CAPACITY = Path(__file__).resolve().parent / "kv_capacity.py"


def build(arch: str, dest: Path) -> Path:
    """A tiny random-weight model of the builder's architecture `arch` (built by the suite's venv)."""
    subprocess.run(
        [str(vllm_python()), str(BUILDER), str(dest), "64", arch],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120,
    )
    return dest


def engine_args(max_model_len: int) -> list[str]:
    return ["--max-model-len", str(max_model_len), "--max-num-batched-tokens", "2048"]


def size_kv_caches(
    cases: list[tuple[str, Path, list[str]]], out: Path, python: Path | None = None
) -> dict[str, str]:
    """vLLM's log for each (name, model, engine args), from one interpreter (harness/kv_capacity.py) of
    `python`'s vLLM (default: the suite's venv)."""
    argv = [
        {
            "name": name,
            "argv": ["--model", str(model), "--load-format", "dummy", "--enforce-eager", *args],
        }
        for name, model, args in cases
    ]
    with out.open("w") as log:
        subprocess.run(
            [str(python or vllm_python()), str(KV_CAPACITY), json.dumps(argv)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=engine_env({**ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}),
            timeout=120 + 60 * len(cases),
            check=False,
        )
    text = out.read_text(errors="replace")
    logs = {}
    for name, *_ in cases:
        start, end = text.find(f"=== CASE {name}\n"), text.find(f"=== DONE {name}\n")
        assert 0 <= start < end, f"{name}: the engine did not finish sizing it; see {out}"
        logs[name] = text[start:end]
    return logs


def cpu_plan(model: Path, max_model_len: int, block_size: int = 128, **settings) -> ModelPlan:
    """rocmdoctor's plan of `model` as the CPU engine sizes it: the CPU platform's block size
    (vllm/platforms/cpu.py: 128; 16 for its MLA kernel), the OpenAI server's 2048 batched tokens, no
    async scheduling (the CPU platform turns it off), the fixed KV cache; `settings` override those
    (EngineSettings fields: the vLLM version, async scheduling on as `unit` and `serve` plan)."""
    config = json.loads((model / "config.json").read_text())
    cpu = {"block_size": block_size, "max_num_batched_tokens": 2048, "async_scheduling": False}
    return plan_model(
        str(model),
        config,
        None,
        Memory(0, 1.0, "--kv-cache-memory", KV_BYTES),
        settings=EngineSettings(**{**cpu, **settings}),
        max_model_len=max_model_len,
    )


def capacity(text: str, name: str) -> tuple[int, int, float]:
    """(KV cache tokens, tokens per request, maximum concurrency) from one case's log."""
    match = CAPACITY.search(text)
    assert match, f"{name}: no capacity line in vLLM's log"
    return int(match[1].replace(",", "")), int(match[2].replace(",", "")), float(match[3])
