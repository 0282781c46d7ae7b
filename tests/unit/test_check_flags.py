"""Check mode is a property of the writer (`HostWriter(check_mode=...)`, set once by the command), never a
parameter passed down: no function outside the click command functions takes a parameter named `check`,
`check_only`, `check_mode` or `dry_run`.

ALLOWED lists the ones that remain, each with its reason; a new one fails, and so does an entry that is
gone (remove it), so the list can only shrink."""

from __future__ import annotations

import ast

from conftest import REPO

NAMES = {"check", "check_only", "check_mode", "dry_run"}
ALLOWED = {
    ("src/rocmdoctor/host_writes.py", "HostWriter.__init__", "check_mode"): "where check mode is set, once",
}


def _is_command(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A click command or group function (decorated with `.command(...)`/`.group(...)`)."""
    return any(".command" in ast.unparse(d) or ".group" in ast.unparse(d) for d in node.decorator_list)


def check_parameters() -> set[tuple[str, str, str]]:
    found = set()
    for tree in ("src/rocmdoctor", "checks", "provision"):
        for path in sorted((REPO / tree).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            module = ast.parse(path.read_text(encoding="utf-8"))
            for parent in ast.walk(module):
                for node in ast.iter_child_nodes(parent):
                    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or _is_command(node):
                        continue
                    name = f"{parent.name}.{node.name}" if isinstance(parent, ast.ClassDef) else node.name
                    args = node.args
                    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                        if arg.arg in NAMES:
                            found.add((rel, name, arg.arg))
    return found


def test_no_function_but_a_command_takes_a_check_flag():
    found = check_parameters()
    assert not found - set(ALLOWED), (
        f"take the HostWriter (its check_mode) instead: {sorted(found - set(ALLOWED))}"
    )
    assert not set(ALLOWED) - found, f"gone: remove from ALLOWED {sorted(set(ALLOWED) - found)}"


def test_the_scan_sees_a_check_parameter():
    sample = "def helper(path, check_only=False):\n    pass\n"
    module = ast.parse(sample)
    (node,) = module.body
    assert isinstance(node, ast.FunctionDef) and not _is_command(node)
    assert {a.arg for a in node.args.args} & NAMES == {"check_only"}
