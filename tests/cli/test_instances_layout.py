"""Instance layouts on captured topologies: which devices each vLLM server gets, in ROCm's numbering,
its port and its own memory share, and a clear refusal (with the layouts that do work) otherwise."""

from __future__ import annotations

import dataclasses
import json

import pytest

from harness.hosts import fixture_root, run_cli
from rocmdoctor.commands.host_devices import host_devices
from rocmdoctor.host import Host
from rocmdoctor.provision.server.layout import Device, LayoutError, plan, visible_devices
from rocmdoctor.registry import Context, Options
from rocmdoctor.vllm.memory_rule import recommended

GIB = 1 << 30


def devices(fixture_id: str) -> list[Device]:
    return host_devices(Context(Host(fixture_root(fixture_id)), Options()))


def all_free(_port: int) -> bool:
    return True


def refusal(devs, layout, **kw) -> str:
    with pytest.raises(LayoutError) as info:
        plan(devs, layout, port_free=all_free, **kw)
    return str(info.value)


# -- a CPX node: 8 x MI308X, 4 partitions each -------------------------------------------------


def test_mi308x_cpx_per_partition_gives_every_partition_its_own_server_and_memory():
    devs = devices("mi308x-cpx")
    assert len(devs) == 32 and {d.partitions for d in devs} == {4}
    result = plan(devs, "per-partition", port_free=all_free)
    assert [i.name for i in result.instances] == [str(n) for n in range(32)]
    # ROCm numbers the GPU nodes in KFD order, CPU nodes 0 and 1 skipped: node 2 is device 0.
    assert [i.visible_devices for i in result.instances] == [str(n) for n in range(32)]
    assert [i.kfd_nodes for i in result.instances] == [[n] for n in range(2, 34)]
    assert [i.port for i in result.instances] == list(range(8000, 8032))
    for inst in result.instances:
        (dev,) = inst.devices
        # The partition's own share (its KFD bank), never the whole GPU's 192 GB.
        assert 40 * GIB < dev.memory_total < 50 * GIB
        assert inst.gpu_memory_utilization == recommended(dev.memory_total, dev.memory_free)
    assert result.skipped_ports == [] and result.hidden == []


def test_mi308x_cpx_tensor_parallel_groups_are_the_partitions_of_one_gpu():
    result = plan(devices("mi308x-cpx"), "per-partition", tensor_parallel_size=4, port_free=all_free)
    assert [i.visible_devices for i in result.instances] == [
        ",".join(str(4 * g + k) for k in range(4)) for g in range(8)
    ]
    for inst in result.instances:
        assert len({d.physical_slot for d in inst.devices}) == 1
        assert inst.tensor_parallel_size == 4
        # The tightest partition of the group decides.
        assert inst.gpu_memory_utilization == min(
            recommended(d.memory_total, d.memory_free) for d in inst.devices
        )


def test_mi308x_cpx_refusals_name_the_layouts_that_work():
    devs = devices("mi308x-cpx")
    msg = refusal(devs, "per-gpu")
    assert "per-gpu needs whole GPUs" in msg and "CPX" in msg and "use per-partition" in msg
    assert "--instances per-partition (32 instances)" in msg
    assert "--instances per-partition --tensor-parallel-size 4 (8 instances)" in msg
    msg = refusal(devs, "per-partition", tensor_parallel_size=3)
    assert "32 devices" in msg and "tensor-parallel groups of 3" in msg
    assert "--instances per-partition --tensor-parallel-size 8 (4 instances)" in msg
    msg = refusal(devs, "per-partition", count=33)
    assert "33 instances of 1 device(s) need 33 devices; this host has 32" in msg


def test_one_on_a_cpx_node_pins_the_first_partitions():
    result = plan(devices("mi308x-cpx"), "one", tensor_parallel_size=2, port_free=all_free)
    (inst,) = result.instances
    assert inst.visible_devices == "0,1" and inst.kfd_nodes == [2, 3]


def test_mi300x_cpx_all_partitions_are_instances():
    devs = devices("mi300x-cpx")
    result = plan(devs, "per-partition", port_free=all_free, gpu_memory_utilization=0.8)
    assert len(result.instances) == len(devs)
    assert [i.visible_devices for i in result.instances] == [str(n) for n in range(len(devs))]


# -- whole GPUs ----------------------------------------------------------------------------


def eight_mi300x_spx(numa=lambda i: None, hive=lambda i: 1) -> list[Device]:
    """An 8 x MI300X SPX node: the one captured MI300X (fixture mi300x) at the eight PCI addresses of
    the captured MI300X platform (fixture mi300x-cpx), one XGMI hive, KFD nodes 1-8 after one CPU."""
    (gpu,) = devices("mi300x")
    slots = sorted({d.physical_slot for d in devices("mi300x-cpx")})
    assert len(slots) == 8
    return [
        dataclasses.replace(
            gpu,
            kfd_node=i + 1,
            pci_slot=s,
            physical_slot=s,
            numa_node=numa(i),
            hive_id=hive(i),
            memory_total=192 * GIB,
            memory_free=(191 - i) * GIB,
        )
        for i, s in enumerate(slots)
    ]


def test_mi300x_spx_single_gpu_fixture():
    devs = devices("mi300x")
    assert len(devs) == 1 and devs[0].partitions == 1
    # The capture lacks the used-VRAM counter: say so rather than guess.
    assert "cannot be read" in refusal(devs, "per-gpu")
    result = plan(devs, "per-gpu", port_free=all_free, gpu_memory_utilization=0.9)
    assert [(i.visible_devices, i.kfd_nodes, i.gpu_memory_utilization) for i in result.instances] == [
        ("0", [2], 0.9)
    ]
    msg = refusal(devs, "per-partition", gpu_memory_utilization=0.9)
    assert "no GPU here is partitioned" in msg and "use per-gpu" in msg
    assert "--instances per-gpu (1 instance)" in msg


def test_eight_gpus_per_gpu_and_tensor_parallel_pairs():
    devs = eight_mi300x_spx()
    result = plan(devs, "per-gpu", port_free=all_free)
    assert [i.visible_devices for i in result.instances] == [str(n) for n in range(8)]
    assert [i.gpu_memory_utilization for i in result.instances] == [
        recommended(192 * GIB, (191 - n) * GIB) for n in range(8)
    ]
    pairs = plan(devs, "per-gpu", tensor_parallel_size=2, port_free=all_free)
    assert [i.visible_devices for i in pairs.instances] == ["0,1", "2,3", "4,5", "6,7"]
    assert pairs.instances[1].gpu_memory_utilization == recommended(192 * GIB, 188 * GIB)  # GPU 3 is tighter
    whole = plan(devs, "one", tensor_parallel_size=8, port_free=all_free)
    assert [i.visible_devices for i in whole.instances] == ["0,1,2,3,4,5,6,7"]


def test_eight_gpus_refusals():
    devs = eight_mi300x_spx()
    msg = refusal(devs, "per-gpu", tensor_parallel_size=3)
    assert "8 devices do not split into tensor-parallel groups of 3" in msg
    assert msg.endswith(
        "layouts that work here: --instances one (1 instance); --instances per-gpu (8 instances); "
        "--instances per-gpu --tensor-parallel-size 2 (4 instances); --instances per-gpu "
        "--tensor-parallel-size 4 (2 instances); --instances per-gpu --tensor-parallel-size 8 "
        "(1 instance)"
    )
    assert "needs 16 devices; this host has 8" in refusal(devs, "per-gpu", tensor_parallel_size=16)
    assert "9 instances of 1 device(s) need 9 devices; this host has 8" in refusal(devs, "per-gpu", count=9)
    assert "no GPU here is partitioned" in refusal(devs, "per-partition")
    assert "--count 2 goes with per-gpu or per-partition" in refusal(devs, "one", count=2)
    assert "no GPU here that a vllm-rocm bundle supports" in refusal([], "per-gpu")


def test_tensor_parallel_groups_stay_in_one_numa_node_and_one_hive():
    # GPUs alternate between two sockets in KFD order: pairs are formed per NUMA node.
    devs = eight_mi300x_spx(numa=lambda i: i % 2)
    pairs = plan(devs, "per-gpu", tensor_parallel_size=2, port_free=all_free)
    assert [i.visible_devices for i in pairs.instances] == ["0,2", "1,3", "4,6", "5,7"]
    assert not any("spans NUMA" in n for n in pairs.notes)
    # Two hives of four: a group of eight would cross XGMI hives.
    split = eight_mi300x_spx(hive=lambda i: 1 + i // 4)
    assert [
        i.visible_devices
        for i in plan(split, "per-gpu", tensor_parallel_size=4, port_free=all_free).instances
    ] == ["0,1,2,3", "4,5,6,7"]
    msg = refusal(split, "per-gpu", tensor_parallel_size=8)
    assert "(4 + 4 per XGMI hive)" in msg
    assert "needs 8 devices in one XGMI hive; the largest hive here has 4" in refusal(
        split, "one", tensor_parallel_size=8
    )


def test_tensor_parallel_never_mixes_families():
    devs = eight_mi300x_spx()[:2]
    radeon = dataclasses.replace(
        devs[1],
        kfd_node=3,
        gfx="gfx1100",
        family="rdna3",
        hive_id=0,
        pci_slot="0000:c3:00.0",
        physical_slot="0000:c3:00.0",
    )
    mixed = [devs[0], devs[1], radeon]
    msg = refusal(mixed, "per-gpu", tensor_parallel_size=3)
    assert "several families" in msg and "--family" in msg
    result = plan(mixed, "per-gpu", tensor_parallel_size=2, port_free=all_free, family=devs[0].family)
    assert [i.visible_devices for i in result.instances] == ["0,1"]
    assert [d.kfd_node for d in result.hidden] == [3]
    msg = refusal(mixed, "per-gpu", tensor_parallel_size=3, family=devs[0].family)
    assert "needs 3 devices; this host has 2" in msg


def test_mi350x_single_gpu():
    result = plan(devices("mi350x"), "per-gpu", port_free=all_free, gpu_memory_utilization=0.9)
    assert [(i.visible_devices, i.kfd_nodes) for i in result.instances] == [("0", [1])]


# -- a dGPU beside an unsupported iGPU -------------------------------------------------------


def test_dgpu_beside_igpu_is_pinned_and_the_igpu_hidden():
    devs = devices("rx7900xtx-beside-igpu")
    by_node = {d.kfd_node: d for d in devs}
    assert by_node[1].family and by_node[2].family is None  # gfx1100 dGPU, gfx1033 iGPU (Van Gogh)
    assert (by_node[1].pci_slot, by_node[2].pci_slot) == ("0000:03:00.0", "0000:04:00.0")
    for layout in ("one", "per-gpu"):
        result = plan(devs, layout, port_free=all_free, gpu_memory_utilization=0.9)
        assert [(i.visible_devices, i.kfd_nodes) for i in result.instances] == [("0", [1])]
        assert [d.kfd_node for d in result.hidden] == [2]
        assert any("hidden from the servers: node 2 (gfx1033" in n for n in result.notes)
    assert visible_devices(devs, [by_node[1]]) == "0"
    # The same two GPUs with the iGPU enumerated first by KFD (as on hosts where the iGPU probes
    # first): the dGPU is ROCm's device 1, whatever its PCI address or DRM card number says.
    swapped = [dataclasses.replace(by_node[1], kfd_node=2), dataclasses.replace(by_node[2], kfd_node=1)]
    assert (
        plan(swapped, "per-gpu", port_free=all_free, gpu_memory_utilization=0.9).instances[0].visible_devices
        == "1"
    )


# -- ports --------------------------------------------------------------------------------------


def test_taken_ports_are_skipped_and_reported_and_owned_ones_kept():
    devs = eight_mi300x_spx()
    taken = {8001, 8003}
    result = plan(devs, "per-gpu", count=3, port_free=lambda p: p not in taken)
    assert [i.port for i in result.instances] == [8000, 8002, 8004]
    assert result.skipped_ports == [8001, 8003]
    assert "port 8001 is in use: skipped" in result.notes
    # A port that the written layout's own server holds is not "taken".
    mine = plan(devs, "per-gpu", count=3, port_free=lambda p: p not in taken, owned_ports={8001})
    assert [i.port for i in mine.instances] == [8000, 8001, 8002]
    assert "not enough free ports from 65534" in refusal(devs, "per-gpu", first_port=65534)
    assert "--port must be between 1 and 65535" in refusal(devs, "per-gpu", first_port=0)


# -- the command -------------------------------------------------------------------------------


def test_cli_json_lists_the_instances():
    proc = run_cli(
        "instances",
        "--instances",
        "per-partition",
        "--tensor-parallel-size",
        "4",
        "--port",
        "9100",
        "--json",
        root=fixture_root("mi308x-cpx"),
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema_version"] == 1
    first = doc["instances"][0]
    assert {
        "name",
        "port",
        "visible_devices",
        "kfd_nodes",
        "tensor_parallel_size",
        "gpu_memory_utilization",
    } <= set(first)
    assert (first["name"], first["visible_devices"], first["kfd_nodes"], first["tensor_parallel_size"]) == (
        "0",
        "0,1,2,3",
        [2, 3, 4, 5],
        4,
    )
    # 9100 may be taken on this machine: the ports count up from it, skipping what is in use.
    assert first["port"] >= 9100 and len(doc["instances"]) == 8


@pytest.mark.parametrize(
    "args, words",
    [
        (("--instances", "per-gpu"), "per-gpu needs whole GPUs"),
        (("--instances", "per-partition", "--tensor-parallel-size", "3"), "tensor-parallel groups of 3"),
        (("--instances", "per-partition", "--tensor-parallel-size", "0"), "give a whole number from 1 to 64"),
    ],
)
def test_cli_refusal_is_a_clear_exit_2(args, words):
    proc = run_cli("instances", *args, root=fixture_root("mi308x-cpx"))
    assert proc.returncode == 2 and words in proc.stderr and "Traceback" not in proc.stderr
    assert "layouts that work here" in proc.stderr or "out of range" in proc.stderr


def test_the_single_server_is_pinned_to_the_dgpu():
    from rocmdoctor.provision.server.layout import single_server_devices

    assert single_server_devices(devices("rx7900xtx-beside-igpu")) == "0"
    assert single_server_devices(devices("mi308x-cpx"), tensor_parallel_size=4) == "0,1,2,3"
    with pytest.raises(LayoutError, match="needs 3 devices; this host has 1"):
        single_server_devices(devices("rx7900xtx-beside-igpu"), tensor_parallel_size=3)


@pytest.mark.parametrize("fixture_id", ["no-amd-gpu", "wsl"])
def test_hosts_without_a_usable_gpu_get_a_clear_refusal(fixture_id):
    proc = run_cli("instances", "--instances", "per-gpu", root=fixture_root(fixture_id))
    assert proc.returncode == 2 and "no GPU here that a vllm-rocm bundle supports" in proc.stderr
    assert "Traceback" not in proc.stderr
