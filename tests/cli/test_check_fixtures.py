"""Golden reports of `rocmdoctor check --json` on every host fixture, validated by the packaged schema.

Regenerate after an intended change: ROCMDOCTOR_UPDATE_GOLDEN=1 pytest tests/cli/test_check_fixtures.py
"""

from __future__ import annotations

import json
import os

import jsonschema
import pytest

from harness.hosts import FIXTURE_IDS, check_json, fixture_root, normalize, run_cli
from rocmdoctor.model import Status, exit_code
from rocmdoctor.report import load_schema

UPDATE = os.environ.get("ROCMDOCTOR_UPDATE_GOLDEN") == "1"


@pytest.mark.parametrize("fixture_id", FIXTURE_IDS)
def test_report_matches_golden(fixture_id):
    rc, report, stderr = check_json(fixture_root(fixture_id))
    assert "Traceback" not in stderr
    assert rc == report["exit_code"] == exit_code([Status(c["status"]) for c in report["checks"]])
    golden = fixture_root(fixture_id) / "expected.json"
    got = normalize(report)
    if UPDATE:
        golden.write_text(json.dumps(got, indent=2) + "\n")
    assert got == json.loads(golden.read_text()), f"{fixture_id}: report differs from {golden}"


@pytest.mark.parametrize("fixture_id", FIXTURE_IDS)
def test_golden_satisfies_the_packaged_schema(fixture_id):
    golden = json.loads((fixture_root(fixture_id) / "expected.json").read_text())
    jsonschema.Draft202012Validator(load_schema()).validate(golden)
    allowed = {s.value for s in Status}
    assert {c["status"] for c in golden["checks"]} <= allowed
    for check in golden["checks"]:
        if check["status"] in (Status.WARN.value, Status.FAIL.value):
            assert check["remedy"], check["id"]


def test_schema_status_enum_is_the_status_enum():
    schema = load_schema()
    assert set(schema["properties"]["checks"]["items"]["properties"]["status"]["enum"]) == {
        s.value for s in Status
    }


EXPECTED_VERDICTS = {
    # fixture: {check id: status} for the finding each fixture exists to show
    "strix-halo-nocwsr-dkms": {
        "driver.dkms": "fail",
        "kernel.version": "fail",
        "kernel.cwsr": "fail",
        "python.isolation": "warn",
    },
    "strix-halo-clean": {
        c: "pass"
        for c in (
            "kernel.cwsr",
            "kernel.version",
            "driver.dkms",
            "memory.ttm",
            "memory.gpu",
            "access.devices",
        )
    },
    "strix-halo-default-ttm": {"memory.ttm": "warn", "kernel.cwsr": "pass"},
    # 96 GiB BIOS carve-out, default GTT of half the 31 GiB left to Linux: an APU all the same, and the TTM
    # limit is the default one.
    "strix-halo-carveout": {"gpu.arch": "pass", "memory.ttm": "warn", "kernel.cwsr": "pass"},
    "strix-point": {"access.devices": "warn", "memory.ttm": "warn", "gpu.arch": "pass"},
    "rx7900xtx-no-render": {"access.devices": "fail", "kernel.cwsr": "pass"},
    "r9700": {"kernel.cwsr": "pass", "gpu.arch": "pass"},
    # On Instinct amdgpu-dkms is AMD's supported driver: it passes unless it is out of step with the userspace.
    "mi300x": {"driver.dkms": "pass", "processes.orphans": "warn"},
    "no-amd-gpu": {"gpu.present": "fail", "driver.loaded": "skip", "memory.gpu": "skip"},
    # Per-partition memory from each partition's KFD bank: sized, not the whole GPU's.
    "mi308x-cpx": {"gpu.arch": "pass", "memory.gpu": "pass", "kernel.cwsr": "pass", "memory.ttm": "skip"},
    # No memory banks in the capture: said, with the path, never guessed.
    "mi300x-cpx": {"gpu.arch": "pass", "memory.gpu": "warn", "memory.ttm": "skip"},
    "rx7900xtx-beside-igpu": {"gpu.arch": "warn", "memory.gpu": "warn"},
    "r9700-beside-nvidia": {"gpu.arch": "pass", "kernel.cwsr": "pass"},
    "wsl": {"gpu.present": "fail", "memory.gpu": "skip"},
    # gfx950's CWSR size has the LDS term: the real MI350X export 22687744 passes.
    "mi350x": {"kernel.cwsr": "pass", "gpu.arch": "pass", "memory.gpu": "warn"},
    # Mixed families, both enumeration orders: every check judges the R9700 (its VRAM use is not captured).
    "r9700-beside-780m": {"memory.gpu": "warn", "memory.ttm": "skip", "kernel.cwsr": "pass"},
    "r9700-beside-780m-igpu-first": {"memory.gpu": "warn", "memory.ttm": "skip", "kernel.cwsr": "pass"},
    "strix-halo-beside-r9700": {"memory.gpu": "warn", "memory.ttm": "skip", "kernel.cwsr": "pass"},
    # amdgpu-dkms built for an older kernel: the GPU is named from the PCI bus, with that reason.
    "strix-halo-unbound": {"gpu.present": "fail", "gpu.unbound": "skip"},
    # Device nodes with the host's render gid, no name inside: `--group-add 105`, not chgrp.
    "r9700-docker-unmapped-gid": {"access.devices": "fail", "driver.loaded": "pass"},
    # rocm-systems#2209's 4x R9700 host: the IPC variable, a 64 MiB /dev/shm, kernel 7.0 on 24.04.
    "r9700-x4-ipc-legacy": {"env.multi_gpu": "warn", "kernel.combinations": "warn"},
    # ROCm#6630's kernel 7.0 + DKMS 6.19.4 on 24.04, ROCm Core SDK 10 seen as the userspace.
    "r9700-rocm10-kernel7": {"kernel.combinations": "warn", "env.multi_gpu": "pass"},
}


@pytest.mark.parametrize("fixture_id", FIXTURE_IDS)
def test_each_fixture_shows_its_finding(fixture_id):
    golden = json.loads((fixture_root(fixture_id) / "expected.json").read_text())
    statuses = {c["id"]: c["status"] for c in golden["checks"]}
    assert {k: statuses[k] for k in EXPECTED_VERDICTS[fixture_id]} == EXPECTED_VERDICTS[fixture_id]


def test_one_root_cause_one_failure():
    golden = json.loads((fixture_root("no-amd-gpu") / "expected.json").read_text())
    by_id = {c["id"]: c for c in golden["checks"]}
    assert by_id["driver.loaded"]["details"]["skipped_because_of"] == "gpu.present"
    assert [c["id"] for c in golden["checks"] if c["status"] == "fail"] == ["gpu.present"]


def test_host_facts_describe_the_gpu():
    golden = json.loads((fixture_root("strix-halo-clean") / "expected.json").read_text())
    (gpu,) = golden["host"]["gpus"]
    assert (gpu["gfx"], gpu["family"], gpu["apu"], gpu["gtt_total"]) == (
        "gfx1151",
        "gfx1151",
        True,
        103079215104,
    )


def test_partitioned_host_facts_show_mode_and_count():
    golden = json.loads((fixture_root("mi308x-cpx") / "expected.json").read_text())
    physical = golden["host"]["physical_gpus"]
    assert [(p["partitions"], p["compute_partition"]) for p in physical] == [(4, "CPX")] * 8
    assert len(golden["host"]["gpus"]) == 32
    assert {g["vram_total"] for g in golden["host"]["gpus"]} <= {51539607552, 51522830336}
    by_id = {c["id"]: c for c in golden["checks"]}
    assert "in CPX mode, 4 partitions" in by_id["gpu.arch"]["summary"]


def test_wsl_keeps_its_clear_verdict():
    golden = json.loads((fixture_root("wsl") / "expected.json").read_text())
    (present,) = [c for c in golden["checks"] if c["id"] == "gpu.present"]
    assert present["summary"].startswith("this is WSL (/dev/dxg)")
    assert [c["id"] for c in golden["checks"] if c["status"] == "fail"] == ["gpu.present"]


def test_every_gpu_states_why_it_is_an_apu_or_not():
    for fixture_id in FIXTURE_IDS:
        golden = json.loads((fixture_root(fixture_id) / "expected.json").read_text())
        for gpu in golden["host"]["gpus"]:
            assert gpu["apu"] is not None and gpu["apu_basis"], (fixture_id, gpu["node"])


def test_a_supported_dgpu_beside_an_unsupported_igpu_is_told_to_hide_the_igpu():
    golden = json.loads((fixture_root("rx7900xtx-beside-igpu") / "expected.json").read_text())
    (arch,) = [c for c in golden["checks"] if c["id"] == "gpu.arch"]
    assert arch["summary"].startswith("vLLM can run on gfx1100, but gfx1033 is visible beside it")
    assert "ROCR_VISIBLE_DEVICES" in arch["remedy"] and arch["details"]["unsupported"] == ["gfx1033"]
    (memory,) = [c for c in golden["checks"] if c["id"] == "memory.gpu"]
    assert [row["gfx"] for row in memory["details"]["gpus"]] == ["gfx1100"]  # the iGPU does not size vLLM


def test_carveout_host_reports_the_96_gib_carveout_and_the_small_gtt():
    # bogdanr/fono's `ai-framework`: mem_info_vram_total 103079215104, dmesg "15934M of GTT memory ready."
    golden = json.loads((fixture_root("strix-halo-carveout") / "expected.json").read_text())
    (gpu,) = golden["host"]["gpus"]
    assert (gpu["gfx"], gpu["apu"], gpu["vram_total"], gpu["gtt_total"]) == (
        "gfx1151",
        True,
        96 << 30,
        15934 << 20,
    )
    by_id = {c["id"]: c for c in golden["checks"]}
    (row,) = by_id["memory.gpu"]["details"]["gpus"]
    assert (row["vram_total"], row["gtt_total"]) == (96 << 30, 15934 << 20)
    ttm = by_id["memory.ttm"]["details"]
    # What Linux has left beside the carve-out: 31.1 GiB, twice the default GTT.
    assert (ttm["mem_total"], ttm["gtt_total"], ttm["pages_limit"]) == (2 * (15934 << 20), 15934 << 20, {})
    # The finding this host exists to show: told that a small carve-out plus the TTM limit gives more.
    assert by_id["memory.ttm"]["status"] == "warn"
    assert ttm["carveout"]["carveout_bytes"] == 96 << 30
    assert ttm["carveout"]["reach_after_bytes"] > ttm["carveout"]["reach_now_bytes"] == 96 << 30
    assert "512 MB" in by_id["memory.ttm"]["remedy"]


def test_fix_kernel_on_the_carveout_host_shrinks_the_carveout_before_raising_ttm():
    done = run_cli("--no-color", "fix-kernel", root=fixture_root("strix-halo-carveout"))
    # Exit 1: there are steps (docs/fix-kernel.md).
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    shrink = done.stdout.index("Shrink the BIOS carve-out to 512 MB")
    raise_ttm = done.stdout.index("options ttm pages_limit=")
    assert shrink < raise_ttm
