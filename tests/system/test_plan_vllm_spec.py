"""The plan on real public configs against vLLM's own code (imported from the installed vLLM in a
subprocess: tests/harness/vllm_kv_probe.py), no engine started: vLLM's ModelConfig derives the heads,
head size, MLA and layer types; vLLM's kv_cache_utils computes the capacity and the start-up check."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import FIXTURES, REPO
from harness.engine import require_vllm_python, vllm_python
from rocmdoctor.vllm.memory_plan import GIB, EngineSettings, Memory, plan_model

pytestmark = pytest.mark.engine  # needs the vLLM venv; ~1 min of vLLM imports, no engine start

CONFIGS = FIXTURES / "model_configs"
PROBE = REPO / "tests" / "harness" / "vllm_kv_probe.py"
# (config, max_model_len, KV bytes, kv cache dtype): one that fits and one that does not, per family.
# Gemma 3 27B is multimodal: vLLM's config inspection needs its processor, so its sliding-window
# grouping is verified on the engine instead (test_plan_engine.py, gemma3).
CASES = [
    ("llama-3.1-8b-instruct", 131072, 20 * GIB, "auto"),
    ("llama-3.1-8b-instruct", 131072, 10 * GIB, "auto"),
    ("llama-3.1-8b-instruct", 131072, 10 * GIB, "fp8"),
    ("llama-3.1-70b-instruct", 131072, 30 * GIB, "auto"),
    ("qwen3-8b", 40960, 3 * GIB, "auto"),
    ("qwen3-32b", 40960, 12 * GIB, "auto"),
    ("mistral-7b-instruct-v0.3", 32768, 3 * GIB, "auto"),
    ("deepseek-v3", 163840, 12 * GIB, "auto"),
    ("deepseek-v3", 163840, 8 * GIB, "auto"),
    ("gpt-oss-20b", 131072, 10 * GIB, "auto"),
    ("gpt-oss-20b", 131072, 1 * GIB, "auto"),
    # the Hub spelling (sliding_window_pattern "LLLG" beside layer_types) the parser once refused
    ("exaone-4.0-32b", 131072, 12 * GIB, "auto"),
    ("exaone-4.0-32b", 131072, 2 * GIB, "auto"),
]
RESULTS = Path(os.environ.get("ROCMDOCTOR_PLAN_SPEC_RESULTS", "/tmp/rocmdoctor-plan-vllm-spec.json"))


def test_plan_equals_vllms_own_arithmetic_on_real_configs(tmp_path: Path):
    require_vllm_python()
    cases = []
    for name, length, kv_bytes, kv_dtype in CASES:
        model_dir = tmp_path / name
        if not model_dir.exists():
            model_dir.mkdir()
            shutil.copy(CONFIGS / name / "config.json", model_dir / "config.json")
        cases.append(
            {
                "model_dir": str(model_dir),
                "max_model_len": length,
                "kv_bytes": kv_bytes,
                "block_size": 16,
                "kv_cache_dtype": kv_dtype,
            }
        )
    proc = subprocess.run(
        [str(vllm_python()), str(PROBE)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    vllm = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = []
    for (name, length, kv_bytes, kv_dtype), theirs in zip(CASES, vllm, strict=True):
        config = json.loads((CONFIGS / name / "config.json").read_text())
        # the CPU platform vLLM was imported on runs one batch in flight, of 2048 tokens (or the whole
        # context for MLA, where it turns chunked prefill off): only sliding windows depend on it
        settings = EngineSettings(
            block_size=16,
            kv_cache_dtype=kv_dtype,
            async_scheduling=False,
            max_num_batched_tokens=theirs["max_in_flight_tokens"],
        )
        plan = plan_model(
            name,
            config,
            None,
            Memory(0, 1.0, "--kv-cache-memory", kv_bytes),
            settings=settings,
            max_model_len=length,
        )
        row = {
            "config": name,
            "max_model_len": length,
            "kv_bytes": kv_bytes,
            "kv_cache_dtype": kv_dtype,
            "vllm": theirs,
            "plan_fits": plan.fits,
            "plan_tokens": plan.kv_cache_tokens,
            "plan_concurrency": plan.max_concurrency,
            "plan_largest_len": plan.max_model_len,
        }
        rows.append(row)
        assert plan.fits == theirs["fits"], row
        if theirs["fits"]:
            assert plan.kv_cache_tokens == theirs["tokens"], row
            assert plan.max_concurrency == pytest.approx(theirs["concurrency"], rel=1e-9), row
        else:
            assert plan.max_model_len == theirs["estimated"], row
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
