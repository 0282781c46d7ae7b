"""The shipped rules pass Prometheus's own tools: `promtool check rules` and `promtool test rules`
(tests/fixtures/prometheus/rules_test.yml), and that unit test makes every alert fire at least once."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from harness.promql import RULES, RULES_TEST, rules

pytestmark = pytest.mark.system


def promtool(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["promtool", *argv], capture_output=True, text=True, timeout=120, cwd=RULES_TEST.parent
    )


def test_promtool_checks_the_rules():
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_promtool_unit_tests_pass_and_fire_every_alert():
    done = promtool("test", "rules", RULES_TEST.name)
    assert done.returncode == 0, done.stdout + done.stderr
    fired = {
        case["alertname"]
        for test in yaml.safe_load(RULES_TEST.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]
    }
    assert fired == {rule["alert"] for rule in rules() if "alert" in rule}
