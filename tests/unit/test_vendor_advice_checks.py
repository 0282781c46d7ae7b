"""Vendor advice (checks/data/vendor_advice.json, each entry with its source) read by the checks: the ROCm
releases after 7.2 are placed, and a served gfx1103 on a ROCm userspace the vendor lists as affected
(ROCm/TheRock#7702, first identified in ROCm 10.0.0, open) gets a warning citing the issue and its
remedy. Host trees: the captured r9700-beside-780m fixtures (a Radeon AI PRO R9700 beside a Radeon 780M,
gfx1103), which have no ROCm installed; the ROCm Core SDK 10.x layout (/opt/rocm/core-<release>, the
r9700-rocm10-kernel7 capture's) is added to a copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.hosts import fixture_root, run_check
from rocmdoctor.checks.driver import release_ordinal
from rocmdoctor.facts.vendor_advice import known_issues
from rocmdoctor.model import Status

IGPU_FIRST = "r9700-beside-780m-igpu-first"  # KFD node 1 is the 780M (gfx1103), node 2 the R9700


def _with_rocm(tmp_path: Path, fixture: str, release: str) -> Path:
    root = tmp_path / "host"
    shutil.copytree(fixture_root(fixture), root, symlinks=True)
    (root / f"opt/rocm/core-{release}/lib").mkdir(parents=True)
    return root


def test_rocm_10_1_and_10_2_are_releases_rocmdoctor_places():
    assert release_ordinal((10, 1)) - release_ordinal((7, 2)) == 2  # 7.2, 10.0, 10.1
    assert release_ordinal((10, 2)) == release_ordinal((10, 1)) + 1
    assert release_ordinal((10, 3)) is None  # not shipped as far as the data knows


@pytest.mark.parametrize("release", ["10.0", "10.2"])
def test_a_served_gfx1103_on_an_affected_rocm_is_warned_citing_the_issue(tmp_path, release):
    root = _with_rocm(tmp_path, IGPU_FIRST, release)
    result = run_check(root, "kernel.combinations", gpus=("1",))  # --gpu 1: serve on the 780M
    assert result.status is Status.WARN
    assert f"ROCm {release} (/opt/rocm/core-{release} (ROCm Core SDK layout" in result.summary
    assert "on gfx1103: vLLM or ComfyUI workloads might crash on some Ryzen AI systems" in result.summary
    assert "(ROCm/TheRock#7702" in result.summary
    (issue,) = known_issues("gfx1103")
    assert result.remedy == issue.remedy + "." and "no workaround" in result.remedy
    assert result.details["vendor_issues"][0]["rocm"] == release
    assert result.details["matched"] == []  # no kernel rule: the finding is the vendor's


def test_the_same_host_serving_on_the_r9700_or_without_rocm_is_not_warned(tmp_path):
    """The gfx1103 hidden from vLLM (the default picks the R9700), or no ROCm userspace to judge: the
    report is what it was (the golden reports of these fixtures do not change)."""
    root = _with_rocm(tmp_path, IGPU_FIRST, "10.2")
    served_elsewhere = run_check(root, "kernel.combinations")
    assert served_elsewhere.status is Status.PASS and "vendor_issues" not in served_elsewhere.details
    bare = run_check(fixture_root(IGPU_FIRST), "kernel.combinations", gpus=("1",))
    assert bare.status is Status.PASS and "vendor_issues" not in bare.details


def test_a_rocm_before_the_first_affected_release_is_not_warned(tmp_path):
    root = tmp_path / "host"
    shutil.copytree(fixture_root(IGPU_FIRST), root, symlinks=True)
    (root / "opt/rocm/.info").mkdir(parents=True)
    (root / "opt/rocm/.info/version").write_text("7.2.1-81\n")
    result = run_check(root, "kernel.combinations", gpus=("1",))
    assert result.status is Status.PASS and "vendor_issues" not in result.details


@pytest.mark.parametrize(("release", "skew"), [("10.1", 7), ("10.2", 8)])
def test_instinct_dkms_counts_releases_to_rocm_10_x_instead_of_giving_up(tmp_path, release, skew):
    """instinct-numa (an MI300X host with amdgpu-dkms 6.8.5, the ROCm 6.2 driver): a ROCm 10.x userspace
    was a release rocmdoctor "cannot place"; with the vendor data's releases the distance is counted
    (6.2 -> 6.3 -> 6.4 -> 7.0 -> 7.1 -> 7.2 -> 10.0 -> 10.1 -> 10.2) and judged against AMD's +/-2."""
    from conftest import FIXTURES

    root = tmp_path / "host"
    shutil.copytree(FIXTURES / "checks" / "instinct-numa", root, symlinks=True)
    (root / "opt/rocm/.info/version").write_text(f"{release}.0\n")
    result = run_check(root, "driver.dkms")
    assert "cannot place" not in result.summary
    assert (
        result.status is Status.WARN
        and f"is {skew} releases from the ROCm {release} userspace" in result.summary
    )
    assert result.details["release_skew"] == skew
