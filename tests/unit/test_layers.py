"""The layer rule: core, then the domain packages, then `checks/` and `provision/`, which never import each
other; no import cycles.

The core is host access, the write seam and the result model. The domain packages (`rocmdoctor.facts`,
`rocmdoctor.vllm`, `rocmdoctor.archive`) hold knowledge and pure logic on top of it; the core modules
that run and present things sit above them (the check registry and its context, which carries the
bundles' manifest; policy and report; snapshot, which packs archives; the redactor and the parameter
types, which know vLLM's flags; rendering, which knows the metric names). Checks and provisioning use
all of it.

Static: every import statement in every module, including those inside functions (a lazy import is
still a dependency). Commands and the CLI sit on top and may import everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

PACKAGES = {
    "rocmdoctor": REPO / "src" / "rocmdoctor",
    "rocmdoctor.checks": REPO / "checks",
    "rocmdoctor.provision": REPO / "provision",
}
TOP = ("rocmdoctor.cli", "rocmdoctor.commands", "rocmdoctor.__main__")
# Layer of a module -> layers it must never import.
FORBIDDEN = {
    "core": ("checks", "provision", "domain", "upper-core"),
    "domain": ("checks", "provision", "upper-core"),
    "upper-core": ("checks", "provision"),
    "checks": ("provision",),
    "provision": ("checks",),
}


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if package == "rocmdoctor" and parts and parts[0] in ("probes",):
                continue  # run by path in another interpreter, never imported
            found[".".join([package, *parts])] = path
    return found


DOMAIN = ("rocmdoctor.facts", "rocmdoctor.vllm", "rocmdoctor.archive", "rocmdoctor.cluster")
# Core modules above the domain packages: they may use them, and the domain packages may not use these.
UPPER_CORE = (
    "rocmdoctor.registry",
    "rocmdoctor.policy",
    "rocmdoctor.report",
    "rocmdoctor.snapshot",
    "rocmdoctor.params",
    "rocmdoctor.sensitive",
    "rocmdoctor.rendering",
)


def layer(module: str) -> str:
    if module.startswith(TOP):
        return "top"
    if module.startswith(DOMAIN):
        return "domain"
    if module.startswith(UPPER_CORE):
        return "upper-core"
    if module.startswith("rocmdoctor.checks"):
        return "checks"
    if module.startswith("rocmdoctor.provision"):
        return "provision"
    return "core"


def imports(module: str, path: Path) -> set[str]:
    is_package = path.name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("rocmdoctor")}


GRAPH = {name: imports(name, path) for name, path in modules().items()}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_module_imports_only_lower_layers(module):
    banned = FORBIDDEN.get(layer(module), ())
    wrong = sorted(t for t in GRAPH[module] if layer(t) in banned)
    assert not wrong, f"{module} ({layer(module)}) imports {wrong}: layers import downward only"


def test_no_import_cycles():
    known = set(GRAPH)
    edges = {m: {t for t in GRAPH[m] if t in known and t != m} for m in GRAPH}
    # A package's __init__ importing its own modules (the checks' registration list) is not a cycle
    # a reader trips over; cycles between sibling modules are.
    for module, targets in edges.items():
        edges[module] = {t for t in targets if not t.startswith(module + ".")}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt) :] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def top_level_folder_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        found += [n for n in names if n.split(".")[0] in ("checks", "provision")]
    return found


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_the_folders_are_never_imported_as_top_level_packages(module):
    """`import checks` would load checks/ a second time under another name and register every check twice."""
    assert top_level_folder_imports(modules()[module]) == []


def test_the_rule_sees_a_violation(tmp_path):
    """The scanner itself: a provision module importing checks is caught (relative and absolute)."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from ..checks import facts\n    import rocmdoctor.checks.gpu\n")
    found = imports("rocmdoctor.provision.bad", bad)
    assert {"rocmdoctor.checks", "rocmdoctor.checks.facts", "rocmdoctor.checks.gpu"} <= found
    assert any(layer(t) == "checks" for t in found)
    bad.write_text("import checks.gpu\nfrom provision import unit\nfrom . import gpu\n")
    assert top_level_folder_imports(bad) == ["checks.gpu", "provision"]
