"""`rocmdoctor check` reports capacity: every instance layout the host's GPUs allow, how many servers
each gives, and the memory and --gpu-memory-utilization each server would get, before anything is
written. Expected values come from the fixture files themselves (KFD banks, mem_info, meminfo) and
from vLLM's startup inequality, never from rocmdoctor's own facts."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from rich.console import Console

from harness.hosts import check_json, fixture_root, run_cli
from harness.spx_host import NODES, bank, compose_spx, gpu_nodes
from rocmdoctor.commands.host_devices import host_devices
from rocmdoctor.host import Host
from rocmdoctor.provision.server.capacity import capacity
from rocmdoctor.registry import Context, Options
from rocmdoctor.rendering.capacity import render_capacity
from rocmdoctor.report import load_schema

GIB = 1 << 30
MARGIN = 1 << 30  # what rocmdoctor keeps free below vLLM's rule (memory_rule.DEFAULT_MARGIN_BYTES)


def capacity_of(root: Path) -> dict[str, Any]:
    rc, report, stderr = check_json(root)
    assert "Traceback" not in stderr and rc == report["exit_code"]
    jsonschema.Draft202012Validator(load_schema()).validate(report)
    return report["capacity"]


def layouts(cap: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in cap["layouts"]}


def passes(total: int, free: int, util: float) -> bool:
    """vLLM's startup check, with the 1 GiB rocmdoctor keeps free: ceil(total x util) <= free."""
    return math.ceil(total * util) <= free - MARGIN


def assert_sized(instance: dict[str, Any], memory: dict[int, tuple[int, int]]) -> None:
    """The instance's memory is its devices' (total, free); its utilization is the largest 0.01 step
    every rank passes, and it asks ceil(total x util) of each device."""
    nodes = instance["kfd_nodes"]
    assert instance["memory_total"] == sum(memory[n][0] for n in nodes)
    assert instance["memory_free"] == sum(memory[n][1] for n in nodes)
    util = instance["gpu_memory_utilization"]
    assert all(passes(*memory[n], util) for n in nodes)
    assert util == 1.0 or not all(passes(*memory[n], round(util + 0.01, 2)) for n in nodes)
    assert instance["memory_bytes"] == sum(math.ceil(memory[n][0] * util) for n in nodes)
    assert instance["note"] is None


def bank_memory(root: Path) -> dict[int, tuple[int, int]]:
    """KFD node -> (total, free) of its frame-buffer bank, read from the tree."""
    out = {}
    for node in gpu_nodes(root):
        size, used = bank(root, node)
        out[node] = (size, size - used)
    return out


# -- 8 GPUs in SPX ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spx_root(tmp_path_factory) -> Path:
    return compose_spx(tmp_path_factory.mktemp("spx") / "root")


@pytest.fixture(scope="module")
def spx_capacity(spx_root) -> dict[str, Any]:
    return capacity_of(spx_root)


def test_eight_spx_gpus_offer_one_per_gpu_and_tensor_parallel_groups(spx_root, spx_capacity):
    memory = bank_memory(spx_root)
    assert len(memory) == 8
    cap = spx_capacity
    assert (cap["devices"], cap["families"], cap["unsupported"], cap["note"]) == (8, ["gfx942"], [], None)
    found = layouts(cap)
    works = {
        name: (e["instance_count"], e["devices_per_instance"]) for name, e in found.items() if e["works"]
    }
    assert works == {
        "one": (1, 1),
        "per-gpu": (8, 1),
        "per-gpu tp=2": (4, 2),
        "per-gpu tp=4": (2, 4),
        "per-gpu tp=8": (1, 8),
    }
    gpus = sorted(memory)
    assert [i["kfd_nodes"] for i in found["per-gpu"]["instances"]] == [[n] for n in gpus]
    assert [i["kfd_nodes"] for i in found["per-gpu tp=2"]["instances"]] == [
        gpus[k : k + 2] for k in (0, 2, 4, 6)
    ]
    assert found["per-gpu tp=4"]["options"] == "--instances per-gpu --tensor-parallel-size 4"
    for entry in found.values():
        for instance in entry["instances"]:
            assert_sized(instance, memory)
    # The GPUs differ in what is used: the per-GPU figures differ with them.
    assert len({i["gpu_memory_utilization"] for i in found["per-gpu"]["instances"]}) > 1


def test_eight_spx_gpus_refuse_per_partition_with_the_layouts_that_work(spx_capacity):
    refused = layouts(spx_capacity)["per-partition"]
    assert not refused["works"] and refused["instance_count"] == 0 and refused["instances"] == []
    assert "no GPU here is partitioned" in refused["reason"] and "use per-gpu" in refused["reason"]


def test_a_gpu_whose_memory_is_taken_cannot_start_and_the_others_are_still_sized(tmp_path):
    root = compose_spx(tmp_path / "root")
    busy = sorted(gpu_nodes(root))[3]
    size, _used = bank(root, busy)
    (root / NODES / str(busy) / "mem_banks" / "0" / "used_memory").write_text(f"{size - GIB // 2}\n")
    memory = bank_memory(root)
    found = layouts(capacity_of(root))
    for entry in ("per-gpu", "per-gpu tp=2"):
        for instance in found[entry]["instances"]:
            if busy in instance["kfd_nodes"]:
                assert instance["gpu_memory_utilization"] is None and instance["memory_bytes"] is None
                assert f"node {busy}" in instance["note"] and "vLLM cannot start" in instance["note"]
            else:
                assert_sized(instance, memory)


def test_unreadable_used_memory_is_unknown_not_zero(tmp_path):
    root = compose_spx(tmp_path / "root")
    node = sorted(gpu_nodes(root))[0]
    (root / NODES / str(node) / "mem_banks" / "0" / "used_memory").write_text("not a number\n")
    (first, *rest) = layouts(capacity_of(root))["per-gpu"]["instances"]
    assert first["memory_free"] is None and first["gpu_memory_utilization"] is None
    assert "cannot be read" in first["note"] and "--gpu-memory-utilization" in first["note"]
    assert all(i["gpu_memory_utilization"] is not None for i in rest)


# -- CPX: every partition its own device -------------------------------------------------------


def test_cpx_partitions_are_instances_each_with_its_own_share():
    root = fixture_root("mi308x-cpx")
    memory = bank_memory(root)
    found = layouts(capacity_of(root))
    assert len(memory) == 32
    counts = {name: e["instance_count"] for name, e in found.items() if e["works"]}
    assert counts == {
        "one": 1,
        "per-partition": 32,
        "per-partition tp=2": 16,
        "per-partition tp=4": 8,
        "per-partition tp=8": 4,
    }
    assert [i["kfd_nodes"] for i in found["per-partition"]["instances"]] == [[n] for n in sorted(memory)]
    for entry in found.values():
        for instance in entry["instances"]:
            assert_sized(instance, memory)
    refused = found["per-gpu"]
    assert not refused["works"] and "CPX" in refused["reason"] and "use per-partition" in refused["reason"]


def test_cpx_capacity_is_what_instances_would_lay_out():
    """check and `instances` read the same devices through the same layout: same groups, same memory."""
    root = fixture_root("mi308x-cpx")
    entry = layouts(capacity_of(root))["per-partition tp=2"]
    proc = run_cli(
        "instances", "--instances", "per-partition", "--tensor-parallel-size", "2",
        "--port", "47100", "--json", root=root,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    planned = json.loads(proc.stdout)["instances"]
    assert [(i["kfd_nodes"], i["gpu_memory_utilization"]) for i in planned] == [
        (i["kfd_nodes"], i["gpu_memory_utilization"]) for i in entry["instances"]
    ]


def test_cpx_capture_without_memory_banks_says_memory_is_unknown():
    root = fixture_root("mi300x-cpx")
    cap = capacity_of(root)
    assert cap["devices"] == len(gpu_nodes(root))
    entry = layouts(cap)["per-partition"]
    assert entry["instance_count"] == cap["devices"]
    for instance in entry["instances"]:
        assert instance["memory_total"] is None and instance["gpu_memory_utilization"] is None
        assert "cannot be read" in instance["note"]


# -- an APU, a dGPU beside an iGPU, no GPU -----------------------------------------------------


def read_int(path: Path) -> int:
    return int(path.read_text().split()[0])


def test_apu_instance_gets_its_gtt_pool():
    root = fixture_root("strix-point")
    device = (root / "sys/class/drm/renderD128/device").resolve()
    total = read_int(device / "mem_info_gtt_total")
    available = next(
        int(line.split()[1]) * 1024
        for line in (root / "proc/meminfo").read_text().splitlines()
        if line.startswith("MemAvailable:")
    )
    free = min(total - read_int(device / "mem_info_gtt_used"), available)
    (node,) = gpu_nodes(root)
    found = layouts(capacity_of(root))
    assert {n for n, e in found.items() if e["works"]} == {"one", "per-gpu"}
    for name in ("one", "per-gpu"):
        (instance,) = found[name]["instances"]
        assert instance["kfd_nodes"] == [node]
        assert_sized(instance, {node: (total, free)})
    assert not found["per-partition"]["works"]


def test_dgpu_beside_an_unsupported_igpu_lays_out_the_dgpu_only():
    root = fixture_root("rx7900xtx-beside-igpu")
    nodes = gpu_nodes(root)
    igpu = next(n for n, p in nodes.items() if p["gfx_target_version"] == 100303)
    dgpu = next(n for n in nodes if n != igpu)
    cap = capacity_of(root)
    assert cap["devices"] == 1 and cap["families"] == ["gfx110X"]
    (unused,) = cap["unsupported"]
    assert f"node {igpu} " in unused and "gfx1033" in unused
    for name in ("one", "per-gpu"):
        (instance,) = layouts(cap)[name]["instances"]
        assert instance["kfd_nodes"] == [dgpu]
        # This capture has no mem_info for the dGPU: unknown, said so, never guessed.
        assert instance["memory_total"] is None and "cannot be read" in instance["note"]


@pytest.mark.parametrize("fixture_id", ["no-amd-gpu", "wsl"])
def test_no_amd_gpu_says_so(fixture_id):
    cap = capacity_of(fixture_root(fixture_id))
    assert cap == {
        "serving": {"family": None, "gpus": [], "ambiguous": None},
        "devices": 0,
        "families": [],
        "unsupported": [],
        "note": "no GPU that a vllm-rocm bundle supports: there is no layout to choose",
        "layouts": [],
    }


# -- the human section -------------------------------------------------------------------------


def capacity_lines(root: Path) -> list[str]:
    proc = run_cli("--no-color", "check", root=root, env={"COLUMNS": "400"})
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("Capacity:"))
    return lines[start : lines.index("", start) if "" in lines[start:] else None]


def test_text_report_has_one_line_per_layout(spx_root, spx_capacity):
    lines = capacity_lines(spx_root)
    assert lines[0].startswith(f"Capacity: {spx_capacity['devices']} device(s) (gfx942)")
    body = lines[1:]
    assert len(body) == len(spx_capacity["layouts"])
    for line, entry in zip(body, spx_capacity["layouts"], strict=True):
        assert line.strip().startswith(entry["name"])
        if entry["works"]:
            n = entry["instance_count"]
            assert f"{n} instance{'s' if n != 1 else ''} x {entry['devices_per_instance']} device" in line
            utils = sorted({i["gpu_memory_utilization"] for i in entry["instances"]})
            assert f"{utils[0]:.2f}" in line and f"{utils[-1]:.2f}" in line
        else:
            assert f"refused: {entry['reason']}" in line


def test_text_report_without_a_gpu_is_one_line():
    assert capacity_lines(fixture_root("no-amd-gpu")) == [
        "Capacity: no GPU that a vllm-rocm bundle supports: there is no layout to choose"
    ]


def test_text_report_names_the_unused_igpu():
    lines = capacity_lines(fixture_root("rx7900xtx-beside-igpu"))
    assert any(line.strip().startswith("not used: node") and "gfx1033" in line for line in lines)
    assert any("memory unknown" in line for line in lines)


# -- two GPU families ------------------------------------------------------------------------


def test_two_families_are_laid_out_apart_and_the_options_name_the_family():
    """A workstation with an RX 7900 XTX and an R9700 (captured separately; no capture has both):
    one bundle serves one family, so each family's layouts are listed with its --family."""

    def only_device(fixture_id: str):
        (device,) = host_devices(Context(Host(fixture_root(fixture_id)), Options()))
        return device

    navi31, navi48 = only_device("rx7900xtx-no-render"), only_device("r9700")
    cap = capacity([dataclasses.replace(navi48, kfd_node=2), navi31])
    assert cap["devices"] == 2 and cap["families"] == [navi31.family, navi48.family]
    working = [(e["family"], e["name"], e["options"]) for e in cap["layouts"] if e["works"]]
    assert working == [
        (family, name, f"--instances {name} --family {family}")
        for family in (navi31.family, navi48.family)
        for name in ("one", "per-gpu")
    ]
    by_family = {
        e["family"]: e["instances"][0]["kfd_nodes"] for e in cap["layouts"] if e["name"] == "per-gpu"
    }
    assert by_family == {navi31.family: [1], navi48.family: [2]}
    console = Console(record=True, width=300, color_system=None)
    render_capacity(cap, console)
    text = console.export_text()
    assert f"per-gpu [{navi48.family}]" in text and f"per-gpu [{navi31.family}]" in text
