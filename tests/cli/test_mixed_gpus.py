"""Mixed GPU families (an iGPU beside an R9700, in both KFD enumeration orders; Strix Halo with an R9700
eGPU): memory.gpu, memory.ttm, kernel.cwsr, the capacity section and the unit judge and pin the same GPU,
named by identity; an open choice is refused with the `--gpu` options named."""

from __future__ import annotations

import json
import os
import re

import pytest
from click.testing import CliRunner

from harness.hosts import check_json, fixture_root
from rocmdoctor.cli import cli as rocmdoctor_cli
from rocmdoctor.provision.server.layout import (
    AmbiguousGpus,
    Device,
    LayoutError,
    single_server_devices,
    usable,
)

R9700_SLOT = "0000:05:00.0"  # location_id 1280 of the R9700 capture
# fixture -> (KFD node of the R9700, its ROCR index, the iGPU's PCI slot, its KFD node)
MIXED = {
    "r9700-beside-780m": (1, 0, "0000:64:00.0", 2),
    "r9700-beside-780m-igpu-first": (2, 1, "0000:64:00.0", 1),
    "strix-halo-beside-r9700": (2, 1, "0000:65:00.0", 1),
}


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(rocmdoctor_cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def unit_text(fixture_id: str, *extra: str) -> tuple[int, str]:
    root = str(fixture_root(fixture_id))
    return cli("--root", root, "unit", "--model", "m", "--gpu-memory-utilization", "0.9", *extra)


@pytest.mark.parametrize("fixture_id", sorted(MIXED))
def test_checks_capacity_and_unit_judge_the_same_gpu(fixture_id):
    node, index, _igpu_slot, _igpu_node = MIXED[fixture_id]
    rc, report, stderr = check_json(fixture_root(fixture_id))
    assert "Traceback" not in stderr
    by_id = {c["id"]: c for c in report["checks"]}
    (row,) = by_id["memory.gpu"]["details"]["gpus"]
    assert row["identity"] == {
        "kfd_node": node,
        "pci_slot": R9700_SLOT,
        "render_node": row["identity"]["render_node"],
        "rocr_index": index,
        "served": True,
    }
    (not_served,) = by_id["memory.gpu"]["details"]["not_served"]
    assert "an iGPU beside a supported dGPU" in not_served
    (ttm_gpu,) = by_id["memory.ttm"]["details"]["gpus"]
    assert (ttm_gpu["kfd_node"], ttm_gpu["rocr_index"]) == (node, index)
    assert R9700_SLOT in by_id["memory.ttm"]["summary"]
    cwsr = {r["node"]: r["identity"]["served"] for r in by_id["kernel.cwsr"]["details"]["gpus"]}
    assert [n for n, served in cwsr.items() if served] == [node]
    serving = report["capacity"]["serving"]
    assert serving["ambiguous"] is None and [(g["kfd_node"], g["rocr_index"]) for g in serving["gpus"]] == [
        (node, index)
    ]
    code, text = unit_text(fixture_id)
    assert code == 0, text
    assert re.search(rf"\bROCR_VISIBLE_DEVICES={index}\b", text)
    assert "HIP_VISIBLE_DEVICES" not in text and "CUDA_VISIBLE_DEVICES" not in text


@pytest.mark.parametrize("fixture_id", sorted(MIXED))
def test_gpu_option_picks_the_igpu_by_slot_or_node(fixture_id):
    _node, _index, igpu_slot, igpu_node = MIXED[fixture_id]
    igpu_index = igpu_node - 1  # one CPU node (0), then GPU nodes: rank = node - 1
    for spec in (igpu_slot, f"node:{igpu_node}", igpu_slot[5:]):
        code, text = unit_text(fixture_id, "--gpu", spec)
        assert code == 0, text
        assert re.search(rf"\bROCR_VISIBLE_DEVICES={igpu_index}\b", text), (spec, text)


def test_gpu_option_that_names_nothing_is_refused_with_the_options():
    code, text = unit_text("r9700-beside-780m", "--gpu", "0000:99:00.0")
    assert code == 2 and "Traceback" not in text
    assert "--gpu 0000:05:00.0" in text and "--gpu 0000:64:00.0" in text
    code, text = unit_text("r9700-beside-780m", "--gpu", "not/a/slot")
    assert code == 2 and "PCI slot" in text


def test_unit_json_names_the_pinned_gpu_by_identity():
    code, text = unit_text("r9700-beside-780m-igpu-first", "--json")
    assert code == 0, text
    notes = json.loads(text)["server_args"]["notes"]
    assert any("vLLM device 0 = node 2 (gfx1201 0000:05:00.0)" in n for n in notes), notes


def device(node: int, gfx: str, family: str | None, apu: bool, slot: str) -> Device:
    return Device(
        kfd_node=node,
        gfx=gfx,
        family=family,
        pci_slot=slot,
        apu=apu,
        memory_total=1 << 34,
        memory_free=1 << 34,
    )


def test_two_dgpu_families_are_ambiguous_and_name_the_options():
    # RX 7900 XTX (gfx110X) and R9700 (gfx120X), both discrete: nothing picks by enumeration order.
    devices = [
        device(1, "gfx1100", "gfx110X", False, "0000:03:00.0"),
        device(2, "gfx1201", "gfx120X", False, R9700_SLOT),
    ]
    with pytest.raises(AmbiguousGpus) as err:
        usable(devices, None)
    assert "--gpu 0000:03:00.0" in str(err.value) and f"--gpu {R9700_SLOT}" in str(err.value)
    assert single_server_devices(devices, gpus=[R9700_SLOT]) == "1"
    assert single_server_devices(devices, family="gfx110X") == "0"
    with pytest.raises(LayoutError, match="several families"):
        usable(devices, None, ["node:1", "node:2"])


def test_igpu_of_the_dgpus_family_is_not_grouped_with_it():
    # A 780M (gfx1103) is in the 7900 XTX's family gfx110X, but a server never spans an iGPU and a dGPU.
    devices = [
        device(1, "gfx1103", "gfx110X", True, "0000:64:00.0"),
        device(2, "gfx1100", "gfx110X", False, "0000:03:00.0"),
    ]
    keep, hidden = usable(devices, None)
    assert [d.kfd_node for d in keep] == [2] and [d.kfd_node for d in hidden] == [1]


def test_unit_for_two_rdna_gpus_turns_legacy_ipc_off():
    code, text = cli(
        "--root",
        str(fixture_root("r9700-x4-ipc-legacy")),
        "unit",
        "--model",
        "m",
        "--gpu-memory-utilization",
        "0.9",
        "--tensor-parallel-size",
        "2",
    )
    assert code == 0, text
    assert re.search(r"\bROCR_VISIBLE_DEVICES=0,1\b", text) and re.search(
        r"\bHSA_ENABLE_IPC_MODE_LEGACY=0\b", text
    )
    code, text = unit_text("r9700-x4-ipc-legacy")
    assert code == 0 and "HSA_ENABLE_IPC_MODE_LEGACY" not in text  # one GPU: no IPC between ranks


# The units these hosts produce, kept beside their golden reports (regenerate with ROCMDOCTOR_UPDATE_GOLDEN=1).
UNIT_CASES = {
    "r9700-beside-780m": (),
    "r9700-beside-780m-igpu-first": (),
    "strix-halo-beside-r9700": (),
    "r9700-x4-ipc-legacy": ("--tensor-parallel-size", "2"),
}


@pytest.mark.parametrize("fixture_id", sorted(UNIT_CASES))
def test_unit_matches_golden(fixture_id):
    code, text = unit_text(fixture_id, *UNIT_CASES[fixture_id])
    assert code == 0, text
    golden = fixture_root(fixture_id) / "expected-unit.service"
    if os.environ.get("ROCMDOCTOR_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert text == golden.read_text()


def test_instances_pin_the_same_gpu_and_say_why_the_igpu_is_hidden():
    root = str(fixture_root("r9700-beside-780m-igpu-first"))
    code, text = cli("--root", root, "instances", "--model", "m", "--gpu-memory-utilization", "0.9")
    assert code == 0, text
    assert "ROCR_VISIBLE_DEVICES=1" in text and "[node 2 (gfx1201 0000:05:00.0)]" in text
    assert "hidden from the servers: node 1 (gfx1103 0000:64:00.0) (an iGPU beside a supported dGPU" in text
    code, text = cli("--root", root, "instances", "--model", "m", "--gpu", "0000:64:00.0")
    assert code == 0 and "ROCR_VISIBLE_DEVICES=0" in text and "[node 1 (gfx1103 0000:64:00.0)]" in text


def test_ray_backend_keeps_the_pin():
    code, text = unit_text(
        "r9700-x4-ipc-legacy", "--tensor-parallel-size", "2", "--", "--distributed-executor-backend", "ray"
    )
    assert code == 0, text
    assert re.search(r"\bRAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES=1\b", text)


def test_check_and_fix_with_gpu_judge_the_igpu_and_agree():
    root = str(fixture_root("r9700-beside-780m"))
    code, text = cli("--root", root, "check", "--json", "--gpu", "0000:64:00.0")
    report = json.loads(text)
    by_id = {c["id"]: c for c in report["checks"]}
    (row,) = by_id["memory.gpu"]["details"]["gpus"]
    assert row["identity"]["kfd_node"] == 2 and row["pool"] == "gtt"
    assert by_id["memory.ttm"]["status"] == "warn" and by_id["memory.ttm"]["details"]["gpu"]["kfd_node"] == 2
    assert [g["kfd_node"] for g in report["capacity"]["serving"]["gpus"]] == [2]
    code, text = cli("--root", root, "fix", "--check", "--gpu", "node:2")
    assert code == 0 and "+options ttm pages_limit=" in text
    code, text = cli("--root", root, "check", "--gpu", "node:9")
    assert code == 2 and "--gpu 0000:05:00.0" in text
