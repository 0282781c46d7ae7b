"""Constants and commands shared by the serve/unit tests that run the test bundle's real engine."""

from __future__ import annotations

import sys
from pathlib import Path

TEST_FAMILY = "gfx1151"
TEST_TAG = "vllm0.32.0-rocm7.0.0-gfx1151"
# The engine runs on the CPU: HF offline, a fixed 1 GiB KV cache (without it the CPU worker asks
# for 0.92 of a NUMA node and refuses to start on a shared 24 GiB machine).
# One interpreter fewer: EngineCore runs inside the API server's process (VLLM_ENABLE_V1_MULTIPROCESSING=0).
# Each of the CPU engine's processes imports torch and vLLM; without the EngineCore process a start took
# 24 CPU-s against 39 and half the time to /health under load (tests/bench/engine_processes.py).
# Tests whose subject is the EngineCore process (its orphaning, its death) use ENGINE_CORE_ENV.
ENGINE_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
ENGINE_CORE_ENV = {**ENGINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
# Eager mode: no torch.compile, ~15 s faster per start on 2 cores; startup timing is measured
# separately (tests/bench/serve_startup.py).
ENGINE_ARGS = ("--load-format", "dummy", "--enforce-eager")


def install_argv(mirror: Path, pins: Path, prefix: Path, python: str = sys.executable) -> list[str]:
    return [
        python,
        "-m",
        "rocmdoctor",
        "install",
        "--mirror",
        str(mirror),
        "--bundles-dir",
        str(pins),
        "--family",
        TEST_FAMILY,
        "--prefix",
        str(prefix),
        "--json",
    ]
