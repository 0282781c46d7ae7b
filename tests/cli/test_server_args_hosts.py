"""Argument resolution on the host fixtures (built from real captures): the pool each GPU really
has, vLLM's startup rule with margin on it, and a refusal wherever the capture cannot tell."""

from __future__ import annotations

import math

import pytest

from harness.hosts import FIXTURE_IDS, fixture_root, run_cli
from rocmdoctor.checks import facts
from rocmdoctor.commands.host_pools import pools_from_facts
from rocmdoctor.host import Host
from rocmdoctor.provision.server.args import ArgumentError, Choices, resolve
from rocmdoctor.registry import Context, Options
from rocmdoctor.vllm.memory_rule import DEFAULT_MARGIN_BYTES

APUS = ("strix-halo-nocwsr-dkms", "strix-halo-clean", "strix-halo-default-ttm", "strix-point")
# What the captures lack: the used-VRAM counters (and for two of them the VRAM size itself).
UNREADABLE_MEMORY = (
    "rx7900xtx-no-render",
    "r9700",
    "mi300x",
    "mi300x-cpx",
    "mi350x",
    "rx7900xtx-beside-igpu",
    "r9700-beside-nvidia",
    "r9700-beside-780m",
    "r9700-docker-unmapped-gid",
    "r9700-x4-ipc-legacy",
    "r9700-rocm10-kernel7",
)
# An iGPU enumerated before the R9700: the server is sized from the GPU it is pinned to, not node order.
MIXED_IGPU_FIRST = ("r9700-beside-780m-igpu-first", "strix-halo-beside-r9700")
# Partitions sized from their own KFD memory bank; an APU whose BIOS carve-out is its memory; no AMD GPU.
PARTITIONED = ("mi308x-cpx",)
CARVE_OUT = ("strix-halo-carveout",)
NO_GPU = ("no-amd-gpu", "wsl", "strix-halo-unbound")


def context(fixture_id: str) -> Context:
    return Context(Host(fixture_root(fixture_id)), Options())


def test_every_fixture_is_covered():
    assert set(APUS + UNREADABLE_MEMORY + PARTITIONED + CARVE_OUT + NO_GPU + MIXED_IGPU_FIRST) == set(
        FIXTURE_IDS
    )


@pytest.mark.parametrize("fixture_id", MIXED_IGPU_FIRST)
def test_mixed_host_is_sized_from_the_pinned_dgpu(fixture_id):
    from rocmdoctor.commands.server_setup import pinned_group

    ctx = context(fixture_id)
    group, notes = pinned_group(ctx, (), 1)
    assert [d.gfx for d in group] == ["gfx1201"] and notes == []
    pools = pools_from_facts(ctx, [d.kfd_node for d in group])
    assert [p.family for p in pools] == ["gfx120X"] and not pools[0].unified
    assert pools_from_facts(ctx)[0].unified  # in KFD order the iGPU comes first: never what is sized


def test_cpx_partitions_are_sized_from_their_own_bank_not_the_whole_gpu():
    ctx = context("mi308x-cpx")
    pools = pools_from_facts(ctx)
    assert len(pools) == 32 and all(not p.unified for p in pools)
    # 4 partitions share one GPU's memory: each pool is about a quarter (its own bank), never the whole GPU's.
    assert all(47 << 30 < (p.total or 0) <= 48 << 30 for p in pools)
    args = resolve(Choices(model="m"), pools)
    util = float(args.value("--gpu-memory-utilization"))
    first = pools[0]  # one server runs on the first device; `rocmdoctor instances` sizes each one
    assert math.ceil(first.total * util) <= (first.free or 0) - DEFAULT_MARGIN_BYTES
    assert math.ceil(first.total * (util + 0.01)) > (first.free or 0) - DEFAULT_MARGIN_BYTES


def test_a_large_carve_out_is_sized_as_the_runtime_reports_it():
    """96 GiB of BIOS VRAM: the runtime reports it as the device's memory; its use is not captured."""
    (pool,) = pools_from_facts(context("strix-halo-carveout"))
    assert pool.total == 96 << 30 and pool.free is None
    with pytest.raises(ArgumentError, match="cannot be read.*--gpu-memory-utilization"):
        resolve(Choices(model="m"), [pool])


@pytest.mark.parametrize("fixture_id", APUS)
def test_apu_uses_its_gtt_pool_and_passes_the_startup_rule(fixture_id):
    ctx = context(fixture_id)
    gpu = facts.gpus(ctx)[0]
    total, free = facts.usable_memory(ctx, gpu)
    assert gpu.apu and total == gpu.gtt_total != gpu.vram_total
    args = resolve(Choices(model="m"), pools_from_facts(ctx))
    util = float(args.value("--gpu-memory-utilization"))
    assert math.ceil(total * util) <= free - DEFAULT_MARGIN_BYTES
    assert math.ceil(total * (util + 0.01)) > free - DEFAULT_MARGIN_BYTES
    assert args.value("--max-num-seqs") == "10"
    assert "unified pool" in args.settings[4].reason


def test_strix_point_with_memory_in_use_gets_a_lower_value_than_the_default():
    # 11.64 of 15.31 GiB free: vLLM's default 0.92 would be refused at startup.
    args = resolve(Choices(model="m"), pools_from_facts(context("strix-point")))
    assert float(args.value("--gpu-memory-utilization")) == pytest.approx(0.69)


@pytest.mark.parametrize("fixture_id", UNREADABLE_MEMORY)
def test_discrete_gpu_whose_memory_the_capture_lacks_is_not_guessed(fixture_id):
    pools = pools_from_facts(context(fixture_id))
    assert pools and not pools[0].unified
    with pytest.raises(ArgumentError, match="cannot be read.*--gpu-memory-utilization"):
        resolve(Choices(model="m"), pools)
    args = resolve(Choices(model="m", gpu_memory_utilization=0.9), pools)
    assert args.value("--gpu-memory-utilization") == "0.90"
    assert args.value("--max-num-seqs") == ("1024" if (pools[0].total or 0) >= 70 << 30 else "256")


def test_tensor_parallel_beyond_the_gpus_present_is_refused():
    with pytest.raises(ArgumentError, match="needs 2 GPUs of one family; this host has 1 gfx942"):
        resolve(
            Choices(model="m", gpu_memory_utilization=0.9, tensor_parallel_size=2),
            pools_from_facts(context("mi300x")),
        )


def test_unit_on_a_fixture_root_prints_the_computed_arguments():
    done = run_cli("unit", "--model", "/srv/models/Qwen3-4B", root=fixture_root("strix-point"))
    assert done.returncode == 0, done.stderr
    exec_start = next(x for x in done.stdout.splitlines() if x.startswith("ExecStart="))
    assert "--gpu-memory-utilization 0.69 --max-num-seqs 10" in exec_start
    refused = run_cli("unit", "--model", "m", root=fixture_root("no-amd-gpu"))
    assert refused.returncode == 2 and "no AMD GPU found" in refused.stderr


def llama_8b_dir(tmp_path) -> str:
    """Llama 3.1 8B's real config with a header-only safetensors file of its real size (bf16)."""
    import json
    import shutil
    import struct

    from conftest import FIXTURES

    model = tmp_path / "Llama-3.1-8B-Instruct"
    model.mkdir()
    shutil.copy(FIXTURES / "model_configs/llama-3.1-8b-instruct/config.json", model / "config.json")
    rows = 8_030_261_248 // 4096  # 8.03 B parameters as one bf16 tensor: only the header is read
    header = {"w": {"dtype": "BF16", "shape": [rows, 4096], "data_offsets": [0, rows * 4096 * 2]}}
    blob = json.dumps(header).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob)
    return str(model)


def test_unit_sets_the_sequences_from_the_model_plan(tmp_path):
    done = run_cli("unit", "--model", llama_8b_dir(tmp_path), "--json", root=fixture_root("strix-halo-clean"))
    assert done.returncode == 0, done.stderr
    import json

    settings = {s["flag"]: s for s in json.loads(done.stdout)["server_args"]["settings"]}
    seqs = settings["--max-num-seqs"]
    assert seqs["value"] == "10" and "fit in the KV cache" in seqs["reason"]  # the APU class caps it at 10
    assert "--max-model-len" not in settings  # the model's own 131072 tokens fit


def test_unit_refuses_a_model_that_cannot_start_here_with_the_plan(tmp_path):
    done = run_cli("unit", "--model", llama_8b_dir(tmp_path), root=fixture_root("strix-point"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "cannot start here" in done.stderr and "rocmdoctor plan" in done.stderr


def test_unit_refuses_a_context_that_does_not_fit(tmp_path):
    done = run_cli(
        "unit",
        "--model",
        llama_8b_dir(tmp_path),
        "--max-model-len",
        "131072",
        "--gpu-memory-utilization",
        "0.3",
        root=fixture_root("strix-halo-clean"),
    )
    assert done.returncode == 2 and "--max-model-len 131072 does not fit" in done.stderr, done.stderr


def test_check_counts_the_models_weights_for_disk_space(tmp_path):
    import json

    done = run_cli(
        "check",
        "--model",
        llama_8b_dir(tmp_path),
        "--only",
        "disk.space",
        "--json",
        root=fixture_root("strix-halo-clean"),
    )
    (disk,) = [c for c in json.loads(done.stdout)["checks"] if c["id"] == "disk.space"]
    assert "weights 16.1 GB" in disk["summary"]  # exact from the header: 8,030,261,248 bf16 parameters


@pytest.mark.parametrize(
    "fixture_id, extra, pinned",
    [
        ("rx7900xtx-beside-igpu", ("--gpu-memory-utilization", "0.9"), "0"),  # the Van Gogh iGPU hidden
        ("mi308x-cpx", ("--tensor-parallel-size", "4"), "0,1,2,3"),  # one GPU's four CPX partitions
        ("strix-halo-clean", (), None),  # one GPU: nothing to hide
    ],
)
def test_unit_pins_the_gpus_it_is_sized_for(fixture_id, extra, pinned):
    import json

    done = run_cli("unit", "--model", "m", *extra, "--json", root=fixture_root(fixture_id))
    assert done.returncode == 0, done.stderr
    env = json.loads(done.stdout)["server_args"]["environment"]
    assert env.get("ROCR_VISIBLE_DEVICES") == pinned and "HIP_VISIBLE_DEVICES" not in env
    unit = json.loads(done.stdout)["unit"]
    assert (f"ROCR_VISIBLE_DEVICES={pinned}" in unit) is (pinned is not None)
