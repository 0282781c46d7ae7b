"""Every JSON document goes through the one envelope: no module but model.py writes a
`schema_version` key itself (a dict literal, or a `schema_version=` keyword of a dict() call);
`model.envelope()` stamps it, so a document cannot carry another version or forget it."""

from __future__ import annotations

import ast

from conftest import REPO

ENVELOPE = "src/rocmdoctor/model.py"


def _stamps(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if "schema_version" in keys:
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "dict"
            and any(k.arg == "schema_version" for k in node.keywords)
        ):
            lines.append(node.lineno)
    return lines


def test_no_document_stamps_its_own_schema_version():
    found = []
    for top in ("src", "provision", "checks"):
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel == ENVELOPE:
                continue
            found += [f"{rel}:{line}" for line in _stamps(ast.parse(path.read_text(), rel))]
    assert not found, f"use model.envelope(...) instead of a schema_version key: {found}"


def test_the_check_finds_a_stamp():
    assert _stamps(ast.parse('doc = {"schema_version": 1, "a": 2}\nx = dict(schema_version=1)')) == [1, 2]
