"""Argument resolution: vLLM's startup rule must hold for what we compute, on every pool shape."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rocmdoctor.provision.server.args import GIB, ArgumentError, Choices, GpuPool, parse_extra, resolve
from rocmdoctor.vllm.memory_rule import DEFAULT_MARGIN_BYTES


def pool(total_gib: float, free_gib: float, unified: bool = False, family: str = "gfx11", name: str = "gpu0"):
    return GpuPool(name, family, int(total_gib * GIB), int(free_gib * GIB), unified)


def util_of(args) -> float:
    return float(args.value("--gpu-memory-utilization"))


@given(total=st.integers(min_value=8 * GIB, max_value=256 * GIB), free_fraction=st.floats(0.3, 1.0))
def test_computed_utilization_passes_vllm_rule_with_margin(total, free_fraction):
    free = int(total * free_fraction)
    args = resolve(Choices(model="m"), [GpuPool("g", "gfx11", total, free, False)])
    util = util_of(args)
    assert math.ceil(total * util) <= free - DEFAULT_MARGIN_BYTES
    # Not wastefully low: one more step would break the rule.
    assert math.ceil(total * (util + 0.01)) > free - DEFAULT_MARGIN_BYTES or util == 1.0


def test_reported_failure_case_gets_a_value_that_starts():
    # The users' report: 76.45 of 96 GiB free, the default 0.92 asks 88.32 GiB and is refused.
    args = resolve(Choices(model="m"), [pool(96, 76.45)])
    assert util_of(args) == pytest.approx(0.78)
    assert "76.45 GiB free of 96.00 GiB" in args.settings[4].reason


def test_unified_pool_gets_small_max_num_seqs_and_discrete_keeps_vllm_defaults():
    apu = resolve(Choices(model="m"), [pool(64, 60, unified=True)])
    assert apu.value("--max-num-seqs") == "10"
    assert resolve(Choices(model="m"), [pool(24, 23)]).value("--max-num-seqs") == "256"
    assert resolve(Choices(model="m"), [pool(192, 190)]).value("--max-num-seqs") == "1024"
    assert (
        resolve(Choices(model="m", max_num_seqs=4), [pool(64, 60, unified=True)]).value("--max-num-seqs")
        == "4"
    )


def test_defaults_bind_loopback_and_name_the_model_after_its_directory():
    args = resolve(Choices(model="/srv/models/Qwen3-4B/"), [pool(24, 23)])
    assert args.argv()[:8] == [
        "--model",
        "/srv/models/Qwen3-4B/",
        "--served-model-name",
        "Qwen3-4B",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
    ]
    assert resolve(Choices(model="Qwen/Qwen3-4B"), [pool(24, 23)]).served_model_name == "Qwen/Qwen3-4B"


def test_tensor_parallel_uses_same_family_and_the_tightest_gpu():
    pools = [
        pool(192, 190, family="gfx942", name="a"),
        pool(192, 100, family="gfx942", name="b"),
        pool(16, 15, family="gfx1100", name="c"),
    ]
    args = resolve(Choices(model="m", tensor_parallel_size=2), pools)
    assert args.value("--tensor-parallel-size") == "2"
    assert math.ceil(192 * GIB * util_of(args)) <= 100 * GIB - DEFAULT_MARGIN_BYTES
    with pytest.raises(ArgumentError, match="needs 3 GPUs of one family.*2 gfx942.*gfx1100"):
        resolve(Choices(model="m", tensor_parallel_size=3), pools)
    assert resolve(Choices(model="m"), pools).value("--tensor-parallel-size") is None


def test_extra_arguments_are_argv_never_shell():
    extra = parse_extra("--enforce-eager --chat-template '{{ a }} $(rm -rf /)' ; echo")
    assert extra == ["--enforce-eager", "--chat-template", "{{ a }} $(rm -rf /)", ";", "echo"]
    args = resolve(Choices(model="m", extra="--enforce-eager --dtype 'bfloat16'"), [pool(24, 23)])
    assert args.argv()[-3:] == ["--enforce-eager", "--dtype", "bfloat16"]
    with pytest.raises(ArgumentError, match="quotes"):
        parse_extra("--chat-template 'unbalanced")


@pytest.mark.parametrize(
    "token", ["--max-num-seqs=4", "--max_num_seqs", "-tp", "--gpu-memory-utilization", "--host", "--port=9"]
)
def test_extra_arguments_that_rocmdoctor_computes_are_reported(token):
    with pytest.raises(ArgumentError, match="computed by rocmdoctor"):
        resolve(Choices(model="m", extra=[token, "1"]), [pool(24, 23)])


@pytest.mark.parametrize("token", ["--api-key", "--api-key=s3cret", "--api_key"])
def test_api_key_on_the_command_line_is_refused(token):
    with pytest.raises(ArgumentError, match="--api-key-file"):
        resolve(Choices(model="m", extra=[token, "s3cret"]), [pool(24, 23)])


def test_no_gpu_needs_an_explicit_utilization():
    with pytest.raises(ArgumentError, match="no AMD GPU found.*--gpu-memory-utilization"):
        resolve(Choices(model="m"), [])
    args = resolve(Choices(model="m", gpu_memory_utilization=0.5), [])
    assert util_of(args) == 0.5 and args.value("--max-num-seqs") is None


def test_explicit_utilization_that_vllm_would_refuse_is_noted():
    args = resolve(Choices(model="m", gpu_memory_utilization=0.92), [pool(96, 76.45)])
    assert util_of(args) == 0.92
    assert "vLLM will refuse to start" in args.notes[0]


def test_kv_cache_bytes_replaces_the_computed_utilization():
    args = resolve(Choices(model="m", extra=["--kv-cache-memory-bytes", "4G"]), [pool(24, 23)])
    assert args.value("--gpu-memory-utilization") is None
    assert "ignores" in args.notes[0]


def test_almost_full_gpu_is_refused_with_what_to_do():
    with pytest.raises(ArgumentError, match="only 1.50 GiB of 64.00 GiB unified pool is free.*fix-kernel"):
        resolve(Choices(model="m"), [pool(64, 1.5, unified=True)])


@pytest.mark.parametrize(
    "choices, message",
    [
        (Choices(model=""), "no model"),
        (Choices(model="m", port=0), "--port"),
        (Choices(model="m", gpu_memory_utilization=1.5), "gpu-memory-utilization"),
        (Choices(model="m", max_model_len=0), "--max-model-len"),
        (Choices(model="m", max_num_seqs=0), "--max-num-seqs"),
        (Choices(model="m", tensor_parallel_size=0), "--tensor-parallel-size"),
    ],
)
def test_bad_choices_are_explained(choices, message):
    with pytest.raises(ArgumentError, match=message):
        resolve(choices, [pool(24, 23), pool(24, 23)])


def test_unreadable_gpu_memory_needs_an_explicit_utilization():
    unknown = GpuPool("node 1 (gfx1100)", "gfx11", None, None, False)
    with pytest.raises(ArgumentError, match="node 1 .*cannot be read.*--gpu-memory-utilization"):
        resolve(Choices(model="m"), [unknown])
    assert util_of(resolve(Choices(model="m", gpu_memory_utilization=0.8), [unknown])) == 0.8
