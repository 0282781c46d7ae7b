"""Partitioned Instinct GPUs: physical GPU, its partitions, and each partition's own memory."""

from __future__ import annotations

import shutil

import pytest

from harness.hosts import fixture_root, run_check
from rocmdoctor.checks.facts import gpus, partition_of, physical_gpus, usable_memory
from rocmdoctor.commands.host_pools import pools_from_facts
from rocmdoctor.host import Host
from rocmdoctor.model import Status
from rocmdoctor.registry import Context
from rocmdoctor.vllm.memory_rule import recommended

GIB = 1 << 30
PCI = "sys/bus/pci/devices"


def ctx_for(root) -> Context:
    return Context(Host(root))


@pytest.fixture
def mi308x(tmp_path):
    root = tmp_path / "mi308x-cpx"
    shutil.copytree(fixture_root("mi308x-cpx"), root, symlinks=True)
    return root


def test_mi308x_cpx_is_eight_gpus_of_four_partitions_with_48_gib_each():
    ctx = ctx_for(fixture_root("mi308x-cpx"))
    phys = physical_gpus(ctx)
    assert len(phys) == 8
    assert {len(p.nodes) for p in phys} == {4}
    assert {(p.compute_partition, p.compute_partition_source) for p in phys} == {("CPX", "kfd")}
    assert phys[0].pci_slot == "0000:0a:00.0" and phys[0].nodes == (2, 3, 4, 5)
    assert phys[4].pci_slot == "0001:0b:00.0"  # domain 1: a second PCI segment, not the same GPU
    found = gpus(ctx)
    assert len(found) == 32
    # Each partition's own bank (48 GiB, some 16 MiB less as captured), never the GPU's 192 GiB.
    assert {g.vram_total for g in found} == {51539607552, 51522830336}
    for gpu in found:
        node_dir = fixture_root("mi308x-cpx") / f"sys/class/kfd/kfd/topology/nodes/{gpu.node}"
        bank = node_dir / "mem_banks/0/properties"
        assert f"size_in_bytes {gpu.vram_total}\n" in bank.read_text()
    assert {g.memory_source for g in found} == {"kfd_bank"}
    first = found[0]
    assert (first.node, first.vram_used, first.render_minor) == (2, 2907979776, 128)
    assert partition_of(ctx, first) == (phys[0], 0)


def test_gpu_memory_utilization_is_computable_per_partition():
    ctx = ctx_for(fixture_root("mi308x-cpx"))
    pools = pools_from_facts(ctx)
    assert len(pools) == 32 and all(47.9 * GIB < p.total <= 48 * GIB and not p.unified for p in pools)
    for gpu in gpus(ctx):
        total, free = usable_memory(ctx, gpu)
        assert (total, free) == (gpu.vram_total, gpu.vram_total - gpu.vram_used)
        assert 0.05 < recommended(total, free) <= 1


def test_memory_gpu_names_the_partition():
    result = run_check(fixture_root("mi308x-cpx"), "memory.gpu")
    assert result.status is Status.PASS
    assert "CPX partition" in result.summary and "of GPU 0000:" in result.summary
    assert 47.9 * GIB < result.details["total_bytes"] <= 48 * GIB
    rows = result.details["gpus"]
    assert len(rows) == 32 and rows[0]["partition"] == {
        "physical_gpu": "0000:0a:00.0",
        "index": 0,
        "of": 4,
        "mode": "CPX",
    }


def test_gpu_arch_states_mode_and_count_once_per_gpu():
    result = run_check(fixture_root("mi308x-cpx"), "gpu.arch")
    assert result.status is Status.PASS
    assert result.summary.count("in CPX mode, 4 partitions") == 8
    assert len(result.details["partitioned_gpus"]) == 8


def test_the_pci_device_mem_info_of_a_partitioned_gpu_is_not_a_partition_size(mi308x):
    """The first partition's render node is the PCI device, whose mem_info covers the whole GPU."""
    device = mi308x / "sys/devices/pci0000:00/0000:0a:00.0"
    (device / "mem_info_vram_total").write_text(f"{192 * GIB}\n")
    (device / "mem_info_vram_used").write_text("0\n")
    first = gpus(ctx_for(mi308x))[0]
    assert (first.vram_total, first.memory_source) == (48 * GIB, "kfd_bank")


def test_sysfs_partition_files_win_over_the_inference(mi308x):
    pci = mi308x / PCI / "0000:0a:00.0"
    pci.mkdir(parents=True)
    (pci / "current_compute_partition").write_text("CPX\n")
    (pci / "current_memory_partition").write_text("NPS1\n")
    (pci / "available_compute_partition").write_text("SPX, DPX, QPX, CPX\n")
    (pci / "available_memory_partition").write_text("NPS1, NPS4\n")
    first = physical_gpus(ctx_for(mi308x))[0]
    assert (first.compute_partition, first.compute_partition_source, first.memory_partition) == (
        "CPX",
        "sysfs",
        "NPS1",
    )
    assert first.available_compute_partitions == ("SPX", "DPX", "QPX", "CPX")
    assert first.available_memory_partitions == ("NPS1", "NPS4")


def test_a_hostile_partition_file_is_ignored(mi308x):
    pci = mi308x / PCI / "0000:0a:00.0"
    pci.mkdir(parents=True)
    (pci / "current_compute_partition").write_text("../../etc; rm -rf /\n")
    first = physical_gpus(ctx_for(mi308x))[0]
    assert (first.compute_partition, first.compute_partition_source) == ("CPX", "kfd")


def test_mi300x_cpx_without_banks_cannot_read_partition_memory():
    root = fixture_root("mi300x-cpx")
    phys = physical_gpus(ctx_for(root))
    assert sorted(len(p.nodes) for p in phys) == [7] + [8] * 7  # one GPU shows 7 partitions, as captured
    assert {p.compute_partition for p in phys} == {"CPX"}
    result = run_check(root, "memory.gpu")
    assert result.status is Status.WARN
    assert "cannot read" in result.summary
    assert "/sys/class/kfd/kfd/topology/nodes/2/mem_banks/*/properties" in result.summary
    assert result.details["recommended_gpu_memory_utilization"] is None


def test_a_whole_gpu_is_spx_and_not_partitioned():
    ctx = ctx_for(fixture_root("mi300x"))
    (phys,) = physical_gpus(ctx)
    assert (phys.partitioned, phys.compute_partition, phys.nodes) == (False, "SPX", (2,))
    assert partition_of(ctx, gpus(ctx)[0]) is None


def test_consumer_gpus_have_no_partition_mode():
    (phys,) = physical_gpus(ctx_for(fixture_root("strix-halo-clean")))
    assert (phys.compute_partition, phys.compute_partition_source) == (None, None)
