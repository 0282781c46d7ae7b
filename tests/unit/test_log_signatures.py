"""Failure signatures: the messages vLLM and ROCm really print (vllm-facts.md, provisioning-facts.md)."""

from __future__ import annotations

import pytest

from rocmdoctor.provision.server.log_signatures import diagnose

CASES = [
    (
        "ValueError: Free memory on device cuda:0 (76.45/96.0 GiB) on startup is less than desired GPU memory "
        "utilization (0.92, 88.32 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
        "free-memory-at-startup",
    ),
    (
        "ValueError: Available memory on node 0 (7.15/11.09 GiB) on startup is less than desired CPU memory "
        "utilization (0.92, 10.2 GiB)",
        "free-memory-at-startup",
    ),
    ('  File "vllm/v1/utils.py", line 125\nRuntimeError: HIP error: hipErrorInvalidImage', "invalid-image"),
    (
        "amdsmi.amdsmi_exception.AmdSmiLibraryException: Error code:\n\t2 | AMDSMI_STATUS_FILE_ERROR",
        "amdsmi-file-error",
    ),
    # lemonade's warning text (system_info.cpp needs_gfx1151_cwsr_fix)
    ("WARNING Your kernel may be missing the gfx1151 CWSR fix", "cwsr"),
    (
        "ValueError: To serve at least one request with the models's max seq len (131072), (18.0 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (4.5 GiB). Based on the available memory, the "
        "estimated maximum model length is 32768. Try increasing `gpu_memory_utilization`",
        "max-model-len",
    ),
    (
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
        "no-kv-cache",
    ),
    (
        "(EngineCore pid=1) ERROR RuntimeError: Unsupported CPU attention configuration: head_dim=16",
        "unsupported-attention",
    ),
    (
        "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 12.94 GiB. GPU 0 has a total capacity of "
        "127.00 GiB of which 18.56 GiB is free.",
        "out-of-memory",
    ),
]


@pytest.mark.parametrize("log, cause_id", CASES, ids=[c for _, c in CASES])
def test_known_failures_are_recognised_with_the_line_as_evidence(log, cause_id):
    text = "INFO starting\n" + log + "\nINFO shutting down\n"
    cause = diagnose(text)
    assert cause is not None and cause.id == cause_id
    assert cause.evidence and cause.evidence in text and "INFO" not in cause.evidence
    assert cause.remedy


def test_the_estimated_length_is_put_into_the_remedy():
    cause = diagnose(CASES[5][0])
    assert "--max-model-len 32768" in cause.remedy


def test_specific_cause_wins_over_the_out_of_memory_that_follows_it():
    cause = diagnose("RuntimeError: hipErrorInvalidImage\n...\ntorch.OutOfMemoryError: HIP out of memory")
    assert cause.id == "invalid-image"


def test_sigkill_without_a_signature_points_at_the_oom_killer_and_unknown_is_none():
    assert diagnose("INFO loading weights\n", returncode=-9).id == "killed"
    assert diagnose("INFO loading weights\n", returncode=1) is None
