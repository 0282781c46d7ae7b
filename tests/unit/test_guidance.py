"""Guidance that fits the host: TTM advice only where the serving GPU is an APU, the carve-out trade on a
Strix Halo, DKMS on Instinct judged by its pairing with the ROCm userspace, and fix-kernel keeping every
TTM step check asks for."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import pytest

from conftest import FIXTURES
from harness.hosts import run_check
from rocmdoctor.checks.driver import dkms_rocm_release, release_ordinal
from rocmdoctor.checks.kernel_guidance import Finding, guidance
from rocmdoctor.checks.memory_guidance import GIB, PAGES_PER_GIB, carveout_advice, serving_nodes, ttm_matters
from rocmdoctor.model import Status

CASES = FIXTURES / "checks"
DEBIAN_13 = {"id": "debian", "version": "13", "like": "", "name": "Debian GNU/Linux"}


@dataclass
class Node:
    apu: bool | None
    family: str | None
    gfx: str = ""


# -- which GPU the memory advice is about ------------------------------------------------------------------


def test_dgpu_beside_an_unsupported_igpu_makes_ttm_irrelevant():
    nodes = [Node(True, None, "gfx1036"), Node(False, "gfx110X", "gfx1101")]  # Raphael iGPU + RX 7700 XT
    assert serving_nodes(nodes) == [nodes[1]] and not ttm_matters(nodes)


def test_strix_halo_alone_needs_ttm_advice():
    assert ttm_matters([Node(True, "gfx1151")])


def test_supported_dgpu_wins_over_a_supported_apu():
    nodes = [Node(True, "gfx1151"), Node(False, "gfx120X")]
    assert serving_nodes(nodes) == [nodes[1]] and not ttm_matters(nodes)


def test_nothing_supported_falls_back_to_every_node():
    nodes = [Node(True, None), Node(False, None)]
    assert serving_nodes(nodes) == nodes and ttm_matters(nodes)


def test_undecided_apu_flag_does_not_claim_unified_memory():
    assert not ttm_matters([Node(None, "gfx942")])


# -- the carve-out trade ----------------------------------------------------------------------------


def test_96_gib_carveout_is_told_what_512_mib_and_a_raised_ttm_limit_give():
    # 128 GiB Strix Halo with "VRAM" 96 GiB in the BIOS: the OS sees about 31 GiB, GTT defaults to half of it.
    advice = carveout_advice(True, 96 * GIB, int(15.5 * GIB), int(30.6 * GIB))
    assert advice is not None
    assert advice.reach_now_bytes == 96 * GIB
    # 96 + 30.6 = 126.6 GiB physical; 512 MiB carve-out leaves 126.1; 4 GiB for the OS -> 122 GiB.
    assert advice.pages_limit == 122 * PAGES_PER_GIB and advice.reach_after_bytes == 122 * GIB
    assert advice.gain_bytes == 26 * GIB
    assert "96.0 GiB" in advice.summary() and "512 MiB" in advice.summary()
    assert "fenced off at boot" in advice.why() and "0.5 GB" in advice.why()
    assert "512 MB" in advice.remedy() and f"ttm.pages_limit={122 * PAGES_PER_GIB}" in advice.remedy()


@pytest.mark.parametrize(
    "apu, vram, gtt, ram",
    [
        (True, 512 << 20, 120 * GIB, 125 * GIB),  # AMD's recommended setup already
        (True, 4 * GIB, 60 * GIB, 124 * GIB),  # a UMA default, not the "VRAM" setting
        (False, 96 * GIB, 60 * GIB, 256 * GIB),  # a dGPU's VRAM is not a carve-out
        (None, 96 * GIB, 16 * GIB, 31 * GIB),  # cannot tell: no advice rather than a wrong one
        (True, 96 * GIB, 16 * GIB, None),  # RAM unreadable
    ],
)
def test_no_carveout_advice_where_it_does_not_fit(apu, vram, gtt, ram):
    assert carveout_advice(apu, vram, gtt, ram) is None


def test_fix_kernel_turns_carveout_advice_into_a_bios_step_then_the_ttm_limit():
    advice = carveout_advice(True, 96 * GIB, int(15.5 * GIB), int(30.6 * GIB))
    ttm = Finding(
        "warn",
        advice.summary(),
        {**advice.finding_details(), "pages_limit": {"ttm": 4063232}, "governing": "ttm"},
        advice.remedy(),
    )
    doc = guidance({"id": "arch", "like": ""}, "6.19.11-1-cachyos", {"memory.ttm": ttm})
    assert [s["id"] for s in doc["steps"]] == ["carveout", "ttm"]
    carveout, limit = doc["steps"]
    assert "512" in carveout["title"] and "fenced off at boot" in carveout["why"]
    assert (
        f'echo "options ttm pages_limit={122 * PAGES_PER_GIB}" | sudo tee /etc/modprobe.d/ttm.conf'
        in limit["commands"]
    )
    assert "sudo mkinitcpio -P" in limit["commands"]


# -- every TTM finding keeps its step ---------------------------------------------------------------------


def test_gttsize_cap_gets_its_removal_not_a_pages_limit():
    ttm = Finding(
        "warn",
        "GTT is 62.5 GiB although ttm.pages_limit allows 121.0 GiB: amdgpu.gttsize caps it",
        {"suggested_pages_limit": 31719424, "pages_limit": {"ttm": 31719424}, "governing": "ttm"},
    )
    for distro, expected in (
        (DEBIAN_13, "sudo update-grub"),
        ({"id": "fedora", "version": "43"}, "sudo grubby --update-kernel=ALL --remove-args=amdgpu.gttsize"),
    ):
        (step,) = guidance(distro, "6.18.5", {"memory.ttm": ttm})["steps"]
        assert step["id"] == "gttsize" and expected in step["commands"]


def test_unreadable_ttm_values_still_get_a_step_with_the_checks_remedy():
    ttm = Finding("warn", "cannot compare the TTM limit with RAM", {"pages_limit": {}}, "Check ... as root.")
    (step,) = guidance(DEBIAN_13, "6.18.5", {"memory.ttm": ttm})["steps"]
    assert step["id"] == "ttm-read" and "# Check ... as root." in step["commands"]


def test_ttm_and_amdttm_that_disagree_are_set_to_the_governing_value():
    ttm = Finding(
        "warn",
        "ttm and amdttm disagree",
        {
            "suggested_pages_limit": 31719424,
            "pages_limit": {"ttm": 16000000, "amdttm": 32505856},
            "governing": "amdttm",
        },
    )
    (step,) = guidance(DEBIAN_13, "6.18.5", {"memory.ttm": ttm})["steps"]
    assert (
        'echo "options amdttm pages_limit=32505856" | sudo tee /etc/modprobe.d/amdttm.conf'
        in step["commands"]
    )
    assert 'echo "options ttm pages_limit=32505856" | sudo tee /etc/modprobe.d/ttm.conf' in step["commands"]


def test_passing_ttm_without_dkms_removal_needs_no_step():
    ttm = Finding(
        "pass",
        "amdttm.pages_limit 32768000",
        {"pages_limit": {"amdttm": 32768000}, "governing": "amdttm", "suggested_pages_limit": 31719424},
    )
    assert guidance(DEBIAN_13, "6.18.5", {"memory.ttm": ttm})["steps"] == []


# -- DKMS on Instinct -----------------------------------------------------------------------------------


def test_dkms_versions_map_to_their_rocm_release():
    assert dkms_rocm_release("6.16.6") == (7, 1)  # captured beside amdgpu-core 7.1.70100
    assert dkms_rocm_release("6.12.12") == (6, 4)
    assert dkms_rocm_release("5.0.19.20.14") is None and dkms_rocm_release(None) is None
    assert release_ordinal((7, 2)) - release_ordinal((6, 4)) == 3
    assert release_ordinal((7, 13)) is None  # TheRock previews have no place in AMD's matrix


def test_instinct_dkms_far_from_its_userspace_is_told_to_align_not_to_remove():
    result = run_check(CASES / "instinct-numa", "driver.dkms")
    assert result.status is Status.WARN and "5 releases" in result.summary
    assert "Keep amdgpu-dkms" in result.remedy and "--usecase=dkms" in result.remedy
    assert "remove" not in result.remedy.lower()


@pytest.mark.parametrize("rocm, status", [("6.3.4-12\n", Status.PASS), ("6.4.0\n", Status.PASS)])
def test_instinct_dkms_within_two_releases_passes(tmp_path, rocm, status):
    root = tmp_path / "host"
    shutil.copytree(CASES / "instinct-numa", root, symlinks=True)
    (root / "opt/rocm/.info/version").write_text(rocm)
    result = run_check(root, "driver.dkms")
    assert result.status is status and "pairs with ROCm" in result.summary


def test_instinct_dkms_judged_against_the_installed_bundle(tmp_path):
    root = tmp_path / "host"
    shutil.copytree(CASES / "instinct-numa", root, symlinks=True)
    (root / "opt/rocm/.info/version").unlink()
    (root / "srv/rd/bundles").mkdir(parents=True)
    (root / "srv/rd/current").symlink_to("bundles/vllm0.19.1-rocm7.13.0-gfx942")
    result = run_check(root, "driver.dkms", prefix="/srv/rd")
    assert result.status is Status.PASS and "cannot place" in result.summary
    assert "vllm0.19.1-rocm7.13.0-gfx942" in result.summary


def test_instinct_fix_kernel_aligns_dkms_and_never_changes_the_kernel():
    dkms = run_check(CASES / "instinct-numa", "driver.dkms")
    finding = Finding(dkms.status.value, dkms.summary, dkms.details, dkms.remedy)
    doc = guidance(
        {"id": "ubuntu", "version": "22.04", "like": "debian"},
        "5.15.0-131-generic",
        {
            "driver.dkms": finding,
            "kernel.version": Finding("pass", "ok"),
            "kernel.cwsr": Finding("pass", "ok"),
        },
    )
    (step,) = doc["steps"]
    assert step["id"] == "dkms-align" and "ROCm 7.2" in step["title"]
    assert "sudo amdgpu-install -y --usecase=dkms" in step["commands"]
    assert any("repo.radeon.com/amdgpu-install/7.2/ubuntu/" in c for c in step["commands"])
    assert not any("remove" in c for c in step["commands"])


def test_dkms_removal_keeps_quiet_when_ttm_already_carries_the_limit():
    ttm = Finding(
        "pass",
        "ok",
        {
            "pages_limit": {"ttm": 32768000, "amdttm": 32768000},
            "governing": "amdttm",
            "suggested_pages_limit": 31719424,
        },
    )
    dkms = Finding("fail", "amdgpu DKMS build shadows the in-tree driver on gfx1151")
    doc = guidance(DEBIAN_13, "6.18.5", {"memory.ttm": ttm, "driver.dkms": dkms})
    assert [s["id"] for s in doc["steps"]] == ["dkms", "kernel"]
