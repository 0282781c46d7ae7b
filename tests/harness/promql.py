"""The metric names a PromQL expression reads, and where the shipped rules and dashboard live.

Enough of PromQL for the expressions rocmdoctor ships: strings, label matchers, ranges and
grouping clauses are removed, function calls and operators dropped; what is left are metric names.
"""

from __future__ import annotations

import json
import re

import yaml

from conftest import REPO

RULES = REPO / "playbooks/roles/rocmdoctor/files/prometheus/rocmdoctor.rules.yml"
DASHBOARD = REPO / "playbooks/roles/rocmdoctor/files/grafana/rocmdoctor-fleet.json"
RULES_TEST = REPO / "tests/fixtures/prometheus/rules_test.yml"

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = {"and", "or", "unless", "bool", "group_left", "group_right", "offset", "Inf", "NaN"}


def metric_names(expr: str) -> set[str]:
    text = _STRING.sub("", expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for match in _NAME.finditer(text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group(0) in _KEYWORDS:
            continue  # a function or an aggregation
        names.add(match.group(0))
    return names


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in doc["panels"] for target in panel["targets"]]


def scaled_rules(text: str) -> str:
    """The shipped rules with time scaled for a test: a `for:` of N minutes becomes N seconds and the
    stale threshold of 600 s becomes 10 s. Expressions and labels are untouched."""
    scaled, fors = re.subn(r"for: (\d+)m", r"for: \1s", text)
    scaled, stale = re.subn(r"\) > 600\b|\} > 600\b", lambda m: m.group(0).replace("600", "10"), scaled)
    assert fors >= 4 and stale == 1, (fors, stale)
    return scaled
