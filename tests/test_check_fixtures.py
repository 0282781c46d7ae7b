"""Golden reports of `rocmdoctor check --json` on every host fixture, validated by the packaged schema.

Regenerate after an intended change: ROCMDOCTOR_UPDATE_GOLDEN=1 pytest tests/test_check_fixtures.py
"""

from __future__ import annotations

import json
import os

import jsonschema
import pytest
from harness.hosts import FIXTURE_IDS, check_json, fixture_root, normalize

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
    "strix-point": {"access.devices": "warn", "memory.ttm": "warn", "gpu.arch": "pass"},
    "rx7900xtx-no-render": {"access.devices": "fail", "kernel.cwsr": "pass"},
    "r9700": {"kernel.cwsr": "pass", "gpu.arch": "pass"},
    # On Instinct amdgpu-dkms is AMD's supported driver: it passes unless it is out of step with the userspace.
    "mi300x": {"driver.dkms": "pass", "processes.orphans": "warn"},
    "no-amd-gpu": {"gpu.present": "fail", "driver.loaded": "skip", "memory.gpu": "skip"},
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
