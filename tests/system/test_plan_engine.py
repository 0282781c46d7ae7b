"""The plan against the real engine: five tiny architectures served by vLLM on the CPU with a fixed KV
cache; the plan's KV cache tokens and maximum concurrency must equal vLLM's log line within 1%, and
a --max-model-len the plan says does not fit must be refused by vLLM, at the length the plan names.

One test starts the engines one after the other (~35 s each); run it under the heavy lock:
    flock /tmp/rocmdoctor-heavy.lock tests/run tests/system/test_plan_engine.py -q
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from harness.engine import (
    BUILDER,
    EngineStartError,
    make_tiny_model,
    require_vllm_python,
    start_engine,
    vllm_python,
)
from rocmdoctor.model_plan import EngineSettings, Memory, plan_model
from rocmdoctor.provision.server_memory import diagnose_url

pytestmark = pytest.mark.engine

CAPACITY = re.compile(
    r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: "
    r"([\d.]+)x"
)
REFUSED = re.compile(r"the estimated maximum model length is (\d+)")
# The CPU platform's choices (vllm/platforms/cpu.py): block size 128, or 16 for the CPU MLA kernel;
# no async scheduling (one batch in flight); the OpenAI server's 2048 batched tokens.
CPU_BLOCK = {"deepseek": 16}
KV_BYTES = 1 << 30  # VLLM_CPU_KVCACHE_SPACE=1: a fixed 1 GiB KV cache
MAX_MODEL_LEN = 512  # the llama builder's max_position_embeddings
# The refusal run: a context of 1M tokens needs 1.5 GiB of KV cache in the qwen3 model (1536 B a token).
LONG_CONTEXT = 1 << 20
ARCHS = ["llama", "qwen3", "gemma3", "deepseek", "oddgqa"]
RESULTS = Path(os.environ.get("ROCMDOCTOR_PLAN_ENGINE_RESULTS", "/tmp/rocmdoctor-plan-engine.json"))


def build(arch: str, dest: Path) -> Path:
    subprocess.run(
        [str(vllm_python()), str(BUILDER), str(dest), "64", arch],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120,
    )
    return dest


def settings_for(arch: str) -> EngineSettings:
    return EngineSettings(
        block_size=CPU_BLOCK.get(arch, 128), max_num_batched_tokens=2048, concurrent_batches=1
    )


def planned(arch: str, model: Path, max_model_len: int, kv_bytes: int = KV_BYTES):
    settings = settings_for(arch)
    config = json.loads((model / "config.json").read_text())
    return plan_model(
        str(model),
        config,
        None,
        Memory(0, 1.0, "--kv-cache-memory", kv_bytes),
        settings=settings,
        max_model_len=max_model_len,
    )


def engine_args(max_model_len: int) -> list[str]:
    return ["--max-model-len", str(max_model_len), "--max-num-batched-tokens", "2048"]


ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def test_plan_matches_vllm_on_five_architectures(tmp_path: Path):
    require_vllm_python()
    rows = []
    for arch in ARCHS:
        model = build(arch, tmp_path / arch)
        plan = planned(arch, model, MAX_MODEL_LEN)
        log = tmp_path / f"{arch}.log"
        with start_engine(
            model, log_path=log, extra_args=engine_args(MAX_MODEL_LEN), env=ENV, startup_timeout=240
        ):
            pass
        match = CAPACITY.search(log.read_text(errors="replace"))
        assert match, f"{arch}: no capacity line in {log}"
        tokens, length, concurrency = (
            int(match[1].replace(",", "")),
            int(match[2].replace(",", "")),
            float(match[3]),
        )
        assert length == MAX_MODEL_LEN
        assert plan.kv_cache_tokens == pytest.approx(tokens, rel=0.01), arch
        assert plan.max_concurrency == pytest.approx(concurrency, rel=0.01, abs=0.006), arch
        rows.append(
            {
                "arch": arch,
                "verified": "CPU engine log",
                "plan_tokens": plan.kv_cache_tokens,
                "vllm_tokens": tokens,
                "plan_concurrency": round(plan.max_concurrency, 2),
                "vllm_concurrency": concurrency,
                "kv_bytes_per_token": plan.kv_bytes_per_token,
                "plan_largest_len": plan.max_model_len,
            }
        )
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")
    # A context the plan says does not fit in the 1 GiB: the qwen3 model with a 1M-token context;
    # vLLM must refuse to start and estimate the same largest --max-model-len as the plan.
    model = tmp_path / "qwen3-long"
    shutil.copytree(tmp_path / "qwen3", model)
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = LONG_CONTEXT
    (model / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    plan = planned("qwen3", model, LONG_CONTEXT)
    assert plan.fits is False and 0 < (plan.max_model_len or 0) < LONG_CONTEXT
    log = tmp_path / "qwen3-long.log"
    with (
        pytest.raises(EngineStartError),
        start_engine(model, log_path=log, extra_args=engine_args(LONG_CONTEXT), env=ENV, startup_timeout=300),
    ):
        pass
    refused = REFUSED.search(log.read_text(errors="replace"))
    assert refused, f"vLLM did not refuse --max-model-len {LONG_CONTEXT} for lack of KV cache; see {log}"
    assert int(refused[1]) == plan.max_model_len
    rows.append(
        {
            "arch": "qwen3",
            "refused_len": LONG_CONTEXT,
            "plan_largest_len": plan.max_model_len,
            "vllm_estimated_len": int(refused[1]),
            "verified": "CPU engine refusal",
        }
    )
    RESULTS.write_text(json.dumps(rows, indent=2) + "\n")


def _complete(base_url: str, errors: list[str]) -> None:
    body = json.dumps(
        {
            "model": "tiny",
            "prompt": "The server answers the prompt",
            "max_tokens": 400,
            "ignore_eos": True,
            "temperature": 0,
        }
    ).encode()
    request = urllib.request.Request(f"{base_url}/v1/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=240) as response:
            response.read(1 << 20)
    except (urllib.error.URLError, OSError) as exc:
        errors.append(str(exc))


def test_metrics_diagnosis_of_an_engine_driven_into_preemption(tmp_path: Path):
    """A KV cache of 16 blocks (4 sequences of 512 tokens) and 24 concurrent 400-token requests."""
    require_vllm_python()
    model = make_tiny_model(tmp_path / "tiny")
    # 16 blocks of 128 tokens: 4 sequences of 512 tokens
    args = ["--num-gpu-blocks-override", "16", "--max-num-seqs", "32"]
    with start_engine(
        model, log_path=tmp_path / "preempt.log", extra_args=args, env=ENV, startup_timeout=240
    ) as engine:
        errors: list[str] = []
        workers = [threading.Thread(target=_complete, args=(engine.base_url, errors)) for _ in range(24)]
        for worker in workers:
            worker.start()
        try:
            diagnosis = diagnose_url(engine.base_url, window_s=20, interval_s=1)
        finally:
            for worker in workers:
                worker.join(timeout=300)
    assert not errors, errors[:3]
    assert diagnosis.preemptions > 0 and diagnosis.verdict == "preempting", diagnosis.findings
    assert diagnosis.num_gpu_blocks == 16 and diagnosis.block_size == 128
    assert diagnosis.usage_peak > 0.8
    flag = diagnosis.changes[0]["flag"]
    assert flag.startswith("--max-num-seqs ") and int(flag.split()[1]) < diagnosis.running_peak
