"""Any subset of the memory files missing: memory.gpu says which file it cannot read, or gives the number
the complete host gives; never a wrong number."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.hosts import fixture_root
from rocmdoctor.checks import load_registry
from rocmdoctor.host import Host
from rocmdoctor.model import Status
from rocmdoctor.registry import Context, Options
from rocmdoctor.vllm.memory_rule import recommended

NODE1 = "sys/class/kfd/kfd/topology/nodes/1"
RENDER = "/sys/class/drm/renderD128/device"
GIB = 1 << 30


def memory_gpu(root: Path):
    registry = load_registry()
    outcomes = registry.run(Context(Host(root), Options()), registry.select(only=["memory.gpu"]))
    return {o.spec.id: o.result for o in outcomes}["memory.gpu"]


def dgpu_tree(dest: Path) -> None:
    """The R9700 fixture with amdgpu's mem_info files added, consistent with its KFD bank."""
    shutil.copytree(fixture_root("r9700"), dest, symlinks=True)
    device = dest / RENDER.lstrip("/")
    device.mkdir(parents=True)
    used = 3 * GIB
    for name, value in (
        ("vram_total", 34208743424),
        ("vram_used", used),
        ("gtt_total", 32 * GIB),
        ("gtt_used", 20 << 20),
    ):
        (device / f"mem_info_{name}").write_text(f"{value}\n")
    (dest / NODE1 / "mem_banks/0/used_memory").write_text(f"{used}\n")


def apu_tree(dest: Path) -> None:
    shutil.copytree(fixture_root("strix-point"), dest, symlinks=True)


# (path shown to the user, path under the root) of every file the memory facts read.
DGPU_FILES = [
    (f"{RENDER}/mem_info_vram_total", f"{RENDER}/mem_info_vram_total"),
    (f"{RENDER}/mem_info_vram_used", f"{RENDER}/mem_info_vram_used"),
    (f"{RENDER}/mem_info_gtt_total", f"{RENDER}/mem_info_gtt_total"),
    (f"{RENDER}/mem_info_gtt_used", f"{RENDER}/mem_info_gtt_used"),
    (f"/{NODE1}/mem_banks", f"/{NODE1}/mem_banks/0/properties"),
    (f"/{NODE1}/mem_banks/0/used_memory", f"/{NODE1}/mem_banks/0/used_memory"),
    ("/proc/meminfo", "/proc/meminfo"),
]
APU_DEVICE = "/sys/devices/pci0000:00/0000:c1:00.0"
APU_FILES = [
    (f"{RENDER}/mem_info_{n}", f"{APU_DEVICE}/mem_info_{n}")
    for n in ("vram_total", "vram_used", "gtt_total", "gtt_used")
] + [(f"/{NODE1}/mem_banks", f"/{NODE1}/mem_banks/0/properties"), ("/proc/meminfo", "/proc/meminfo")]


TRUTH: dict[str, object] = {}


def truth_of(build):
    """memory.gpu on the complete tree, once per tree."""
    if build.__name__ not in TRUTH:
        with tempfile.TemporaryDirectory() as tmp:
            build(Path(tmp) / "full")
            TRUTH[build.__name__] = memory_gpu(Path(tmp) / "full")
    return TRUTH[build.__name__]


def check_subset(build, files, removed: set[int]) -> None:
    truth = truth_of(build)
    assert truth.status is Status.PASS and truth.details["recommended_gpu_memory_utilization"]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "cut"
        build(root)
        for index in removed:
            (root / files[index][1].lstrip("/")).unlink()
        result = memory_gpu(root)
        gone = [files[i][0] for i in removed]
        rec = result.details.get("recommended_gpu_memory_utilization")
        if rec is None:
            assert result.status is Status.WARN and "cannot read" in result.summary
            assert any(path in result.summary for path in gone), (result.summary, gone)
            assert "Traceback" not in result.summary
            return
        assert result.details["total_bytes"] == truth.details["total_bytes"]
        row = result.details["gpus"][0]
        if row.get("free_basis"):
            # The one documented bound: an APU's free GTT without mem_info_gtt_used is what RAM has left.
            assert f"{RENDER}/mem_info_gtt_used" in gone and row["unread"]
            bound = min(row["total_bytes"], row["mem_available"])
            assert rec == recommended(row["total_bytes"], bound)
        else:
            assert rec == truth.details["recommended_gpu_memory_utilization"]
            assert result.details["free_bytes"] == truth.details["free_bytes"]


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.sets(st.integers(0, len(DGPU_FILES) - 1)))
def test_dgpu_any_subset_missing(removed):
    check_subset(dgpu_tree, DGPU_FILES, removed)


@SETTINGS
@given(st.sets(st.integers(0, len(APU_FILES) - 1)))
def test_apu_any_subset_missing(removed):
    check_subset(apu_tree, APU_FILES, removed)


def test_every_single_file_missing_is_named_or_harmless():
    for build, files in ((dgpu_tree, DGPU_FILES), (apu_tree, APU_FILES)):
        for index in range(len(files)):
            check_subset(build, files, {index})
