"""Remedies registered by check id (facts/remedies.py): the planner, `fix --only`'s choices, the ids a check's
remedy or a doc names and the check ids each remedy answers all come from one registry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.hosts import fixture_root
from rocmdoctor.checks import load_registry
from rocmdoctor.cli import cli as rocmdoctor_cli
from rocmdoctor.facts import remedies
from rocmdoctor.provision import fix

REPO = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"rocmdoctor fix --only ([A-Za-z0-9_.\-]+)")


def test_the_planner_plans_exactly_the_registered_remedies():
    assert tuple(fix.PLANNERS) == tuple(remedies.FIXES) == fix.IDS


def test_every_check_a_remedy_answers_exists():
    ids = {spec.id for spec in load_registry().specs}
    for fix_id, checks in remedies.FIXES.items():
        assert set(checks) <= ids, (fix_id, set(checks) - ids)
    for part, (fix_id, _param, check_id) in remedies.PARTS.items():
        assert fix_id in remedies.FIXES and check_id in remedies.FIXES[fix_id], part


def named_ids() -> list[tuple[str, str]]:
    found = []
    for path in [*REPO.glob("checks/*.py"), *REPO.glob("src/rocmdoctor/**/*.py"), *REPO.glob("docs/*.md")]:
        found += [(str(path.relative_to(REPO)), m) for m in NAMED.findall(path.read_text())]
    found += [("README.md", m) for m in NAMED.findall((REPO / "README.md").read_text())]
    return found


def test_every_id_a_remedy_or_doc_names_is_registered():
    named = named_ids()
    assert ("checks/multi_gpu.py", "cmdline.iommu") in named  # the case issue 33 names
    for where, fix_id in named:
        assert fix_id in remedies.choices(), f"{where} names `fix --only {fix_id}`, which is not registered"


@pytest.mark.parametrize("choice", sorted({m for _, m in named_ids()} | set(remedies.choices())))
def test_fix_only_accepts_it(choice):
    result = CliRunner().invoke(
        rocmdoctor_cli,
        ["--root", str(fixture_root("r9700-x4-ipc-legacy")), "fix", "--check", "--only", choice],
    )
    assert result.exit_code == 0, result.output


def test_a_part_limits_the_command_line_to_its_parameter():
    wanted = fix.Wanted(
        user="vllm", family="ubuntu", cmdline_add=("iommu=pt",), cmdline_remove=("amdgpu.gttsize",)
    )
    limited = fix._limited(wanted, remedies.selected(("cmdline.iommu",))[1])
    assert limited.cmdline_add == ("iommu=pt",) and limited.cmdline_remove == ()
    assert remedies.selected(("env.multi_gpu",)) == ({"cmdline"}, set())
    assert remedies.selected(("access.devices",))[0] == {"groups", "udev"}


def test_docs_list_every_remedy():
    text = (REPO / "docs/fix.md").read_text()
    assert {m for m in re.findall(r"^\| `([a-z.]+)` \|", text, re.M)} >= set(remedies.FIXES)


def fixable_results() -> list[tuple[str, str, str]]:
    """(fixture, check id, remedy id) for every result of a golden report that says `fix` answers it."""
    import json

    from harness.hosts import FIXTURE_IDS

    found = []
    for fixture_id in FIXTURE_IDS:
        report = json.loads((fixture_root(fixture_id) / "expected.json").read_text())
        for entry in report["checks"]:
            found += [(fixture_id, entry["id"], fix_id) for fix_id in entry["details"].get("fix", [])]
    return found


def test_fixable_results_exist_in_the_goldens():
    """Why four golden reports gained `details.fix` (issue 33 item 4: a check that can be fixed says so in its
    result, machine-readably): memory.ttm on strix-halo-default-ttm and strix-point, access.devices on
    rx7900xtx-no-render, driver.dkms on strix-halo-nocwsr-dkms."""
    assert {(f, c) for f, c, _ in fixable_results()} == {
        ("strix-halo-default-ttm", "memory.ttm"),
        ("strix-point", "memory.ttm"),
        ("rx7900xtx-no-render", "access.devices"),
        ("strix-halo-nocwsr-dkms", "driver.dkms"),
    }


@pytest.mark.parametrize(("fixture_id", "check_id", "fix_id"), fixable_results())
def test_a_fixable_result_names_a_remedy_that_answers_it(fixture_id, check_id, fix_id):
    import json

    assert fix_id in remedies.choices()
    remedy = remedies.PARTS[fix_id][0] if fix_id in remedies.PARTS else fix_id
    assert check_id in remedies.FIXES[remedy]
    result = CliRunner().invoke(
        rocmdoctor_cli,
        ["--root", str(fixture_root(fixture_id)), "fix", "--check", "--json", "--only", fix_id],
    )
    assert result.exit_code == 0, result.output
    (item,) = json.loads(result.output)["items"]
    assert item["id"] == remedy and check_id in item["answers"] and (item["changes"] or item["refused"])
