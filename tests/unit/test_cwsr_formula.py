"""The kernel's CWSR size formula (kfd_queue.c) per generation, against every capture that exports it."""

from __future__ import annotations

import json
import shutil

import pytest

from harness.hosts import FIXTURE_IDS, fixture_root
from rocmdoctor.checks import load_registry
from rocmdoctor.checks.facts import parse_properties
from rocmdoctor.checks.kernel_rules import VGPR_DEFAULT, expected_cwsr, lds_bytes, vgpr_bytes
from rocmdoctor.host import Host
from rocmdoctor.model import Status
from rocmdoctor.registry import Context, Options

NODES = "sys/class/kfd/kfd/topology/nodes"

# An Instinct MI350X node as AMD's CDNA4 documentation describes it: 256 CUs (4 SIMDs each) in
# 8 XCDs, 160 KiB LDS per CU, 4 shader arrays per XCD. cwsr_size 22687744 is what a real MI350X
# exports (issue 14); the formula without the gfx950 LDS term gave 19542016.
MI350X = {
    "simd_count": 1024,
    "simd_per_cu": 4,
    "num_xcc": 8,
    "array_count": 32,
    "simd_arrays_per_engine": 1,
    "lds_size_in_kb": 160,
    "gfx_target_version": 90500,
}
MI350X_EXPORTED = 22687744


def exported_captures() -> list[tuple[str, dict[str, int]]]:
    """Every KFD properties file in the fixtures that exports cwsr_size."""
    found = []
    for fixture_id in FIXTURE_IDS:
        for props_file in sorted((fixture_root(fixture_id) / NODES).glob("*/properties")):
            props = parse_properties(props_file.read_text())
            if "cwsr_size" in props and props.get("gfx_target_version"):
                found.append((f"{fixture_id}/{props_file.parent.name}", props))
    return found


def test_there_are_captures_that_export_the_sizes():
    names = {name.split("/")[0] for name, _ in exported_captures()}
    assert {"strix-halo-clean", "r9700", "mi350x"} <= names


@pytest.mark.parametrize("name, props", exported_captures(), ids=lambda v: v if isinstance(v, str) else "")
def test_formula_matches_every_exported_capture(name, props):
    assert expected_cwsr(props) == (props["cwsr_size"], props["ctl_stack_size"]), name


def test_gfx950_includes_the_lds_term():
    assert lds_bytes(90500, MI350X) == 160 << 10 and lds_bytes(90402, {}) == 0x10000
    assert expected_cwsr(MI350X) == (MI350X_EXPORTED, 12288)
    old = dict(MI350X, lds_size_in_kb=64)  # what the formula gave with LDS_SIZE_PER_CU
    assert expected_cwsr(old)[0] == 19542016


@pytest.mark.parametrize(
    "target, vgpr",
    [
        (90402, 0x80000),
        (90010, 0x80000),
        (90008, 0x80000),
        (90500, 0x80000),
        (90400, 0x40000),
        (110000, 0x60000),
        (110001, 0x60000),
        (110002, 0x40000),
        (110501, 0x60000),
        (110500, 0x40000),
        (120000, 0x60000),
        (120001, 0x60000),
        (100300, 0x40000),
    ],
)
def test_vgpr_bytes_per_target_as_in_kfd_queue_c(target, vgpr):
    assert vgpr_bytes(target) == vgpr


def test_per_xcc_array_count_for_multi_xcc_nodes():
    """sysfs prints array_count x num_xcc; a pre-Navi10 wave count must divide it back."""
    few_arrays = {
        "simd_count": 64,
        "simd_per_cu": 4,
        "num_xcc": 4,
        "array_count": 4,
        "simd_arrays_per_engine": 1,
        "gfx_target_version": 90402,
        "lds_size_in_kb": 64,
    }
    # 4 CUs per XCC: min(4 * 40, (4 / 4) / 1 * 512) = 160 waves -> ctl ALIGN(40 + 1280 + 8) = 4096
    assert expected_cwsr(few_arrays)[1] == 4096


def test_gfx10_control_stack_is_capped_at_0x7000():
    navi21 = {"simd_count": 160, "simd_per_cu": 2, "gfx_target_version": 100300, "lds_size_in_kb": 64}
    assert expected_cwsr(navi21)[1] == 0x7000


def test_instinct_partitions_and_whole_gpus():
    mi300x = parse_properties((fixture_root("mi300x") / NODES / "2" / "properties").read_text())
    assert expected_cwsr(mi300x) == (23203840, 12288)  # per XCC, 38 CUs each
    part = parse_properties((fixture_root("mi308x-cpx") / NODES / "2" / "properties").read_text())
    assert expected_cwsr(part) == (12214272, 8192)  # one XCC of 20 CUs


def test_an_unbumped_gfx1151_kernel_is_told_to_update():
    halo = parse_properties((fixture_root("strix-halo-clean") / NODES / "1" / "properties").read_text())
    assert expected_cwsr(halo, vgpr=VGPR_DEFAULT) == (13942784, 16384)


def run_cwsr(root):
    registry = load_registry()
    outcomes = registry.run(Context(Host(root), Options()), registry.select(only=["kernel.cwsr"]))
    return outcomes[-1].result


def with_node_props(tmp_path, text):
    root = tmp_path / "host"
    shutil.copytree(fixture_root("mi300x"), root, symlinks=True)
    (root / NODES / "2" / "properties").write_text(text)
    return root


def test_kernel_cwsr_passes_on_an_mi350x_exporting_22687744(tmp_path):
    lines = {
        **MI350X,
        "cpu_cores_count": 0,
        "device_id": 0x75A0,
        "cwsr_size": MI350X_EXPORTED,
        "ctl_stack_size": 12288,
    }
    root = with_node_props(tmp_path, "".join(f"{k} {v}\n" for k, v in lines.items()))
    result = run_cwsr(root)
    assert result.status is Status.PASS, result.summary
    row = result.details["gpus"][0]
    expected = [MI350X_EXPORTED, 12288]
    assert (row["gfx"], row["cwsr_size"], row["expected"]) == ("gfx950", MI350X_EXPORTED, expected)


def test_kernel_cwsr_warns_with_the_vgpr_remedy_only_for_the_unbumped_gfx1151(tmp_path):
    text = (fixture_root("strix-halo-clean") / NODES / "1" / "properties").read_text()
    root = tmp_path / "halo"
    shutil.copytree(fixture_root("strix-halo-clean"), root, symlinks=True)
    (root / NODES / "1" / "properties").write_text(text.replace("cwsr_size 19185664", "cwsr_size 13942784"))
    result = run_cwsr(root)
    assert result.status is Status.WARN and "VGPR bump" in result.remedy
    lines = {**MI350X, "cwsr_size": 19542016, "ctl_stack_size": 12288}
    other = with_node_props(tmp_path, "".join(f"{k} {v}\n" for k, v in lines.items()))
    result = run_cwsr(other)
    assert result.status is Status.WARN and "VGPR bump" not in result.remedy
    assert json.dumps(result.details)  # serialisable for the report
