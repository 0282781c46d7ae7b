"""The host classes of issue 34 for `rocmdoctor fix`: each a host fixture (tests/fixtures/hosts/) with
captured files laid over it (tests/fixtures/fix-cases/<case>/: case.json, tree/, SOURCES.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from harness.hosts import fixture_root

CASES_DIR = Path(__file__).resolve().parent.parent / "fixtures" / "fix-cases"
CASE_IDS = sorted(p.name for p in CASES_DIR.iterdir() if (p / "case.json").is_file())


def build(case_id: str, dest: Path) -> Path:
    """The case's tree at dest (a fresh copy: tests write into their own)."""
    case = json.loads((CASES_DIR / case_id / "case.json").read_text())
    shutil.copytree(fixture_root(case["base"]), dest, symlinks=True)
    (dest / "expected.json").unlink(missing_ok=True)
    for name in case.get("remove", []):
        (dest / name).unlink()
    tree = CASES_DIR / case_id / "tree"
    if tree.is_dir():
        shutil.copytree(tree, dest, dirs_exist_ok=True)
    for rel, (old, new) in case.get("patch", {}).items():
        path = dest / rel
        text = path.read_text()
        assert old in text, f"{case_id}: {rel} has no {old!r}"
        path.write_text(text.replace(old, new))
    meta = dest / ".rocmdoctor"
    if "stat" in case:
        stat = json.loads((meta / "stat.json").read_text())
        stat.update(case["stat"])
        (meta / "stat.json").write_text(json.dumps(stat, indent=2, sort_keys=True))
    if "identity" in case:
        (meta / "identity.json").write_text(json.dumps(case["identity"], indent=2))
    return dest
