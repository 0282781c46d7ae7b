"""Rules every check module obeys, enforced on the source and on real runs over every fixture."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import rocmdoctor.checks as checks_pkg
from harness.hosts import FIXTURE_IDS, covered, fixture_root
from rocmdoctor.checks import HELPER_MODULES, MODULES, load_registry
from rocmdoctor.host import Host
from rocmdoctor.registry import Context, run_isolated

CHECKS_DIR = Path(checks_pkg.__file__).parent
FORBIDDEN_MODULES = {"os", "glob", "subprocess", "pathlib", "shutil", "socket"}


def check_sources() -> list[Path]:
    return sorted(CHECKS_DIR.glob("*.py"))


def test_check_ids_are_unique_and_depends_exist():
    specs = load_registry().specs
    ids = [s.id for s in specs]
    assert len(ids) == len(set(ids))
    for spec in specs:
        assert set(spec.depends) <= set(ids), spec.id
        assert spec.reads, f"{spec.id} declares nothing it reads"


@pytest.mark.parametrize("path", check_sources(), ids=lambda p: p.name)
def test_no_check_module_touches_the_system_itself(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            names = {(node.module or "").split(".")[0]} if node.level == 0 else set()
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("open", "__import__")
        ):
            pytest.fail(f"{path.name}:{node.lineno} calls {node.func.id}(); read through ctx.host")
        else:
            continue
        assert not names & FORBIDDEN_MODULES, f"{path.name}:{node.lineno} imports {names & FORBIDDEN_MODULES}"
        assert "checks" not in names, f"{path.name}:{node.lineno}: import rocmdoctor.checks relatively"


def test_modules_tuple_lists_every_check_module():
    on_disk = {m.name for m in pkgutil.iter_modules([str(CHECKS_DIR)])}
    registered = {m.__name__.rsplit(".", 1)[1] for m in MODULES}
    assert registered == on_disk - set(HELPER_MODULES)
    assert set(HELPER_MODULES) <= on_disk


@pytest.mark.parametrize("fixture_id", FIXTURE_IDS)
def test_every_path_a_check_touches_is_declared(fixture_id):
    for spec in load_registry().specs:
        host = Host(fixture_root(fixture_id))
        run_isolated(spec, Context(host))
        undeclared = sorted(
            p for p in host.accessed if p != "/" and not any(covered(p, r) for r in spec.reads)
        )
        assert not undeclared, f"{spec.id} read undeclared paths on {fixture_id}: {undeclared}"


def test_covered_is_segment_wise():
    assert covered("/proc/12/fd/3", "/proc/[0-9]*/fd/*")
    assert covered("/proc/12", "/proc/[0-9]*/fd/*")
    assert not covered("/proc/12/fd/3/x", "/proc/[0-9]*/fd/*")
    assert not covered("/proc/self/fd/3", "/proc/[0-9]*/fd/*")


def test_checks_is_not_a_top_level_module(tmp_path):
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('checks') is None else 1)"
    assert subprocess.run([sys.executable, "-c", probe], check=False, cwd=tmp_path).returncode == 0
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('provision') is None else 1)"
    assert subprocess.run([sys.executable, "-c", probe], check=False, cwd=tmp_path).returncode == 0


def test_every_command_with_a_prefix_honours_rocmdoctor_prefix():
    """One default prefix, and the same environment variable on every command that takes --prefix:
    otherwise `ROCMDOCTOR_PREFIX=/srv/x rocmdoctor check` would judge /opt/rocmdoctor."""
    import click

    from rocmdoctor.cli import COMMANDS, LazyGroup, cli
    from rocmdoctor.registry import DEFAULT_PREFIX

    ctx = click.Context(cli)
    seen = []
    for name in COMMANDS:
        command = LazyGroup.get_command(cli, ctx, name)
        commands = command.commands.values() if isinstance(command, click.Group) else [command]
        for cmd in commands:
            for param in cmd.params:
                if param.name == "prefix":
                    seen.append(f"{name} {cmd.name}")
                    assert param.envvar == "ROCMDOCTOR_PREFIX", f"{name} {cmd.name}"
                    assert str(param.default) == DEFAULT_PREFIX, f"{name} {cmd.name}"
    assert {"check check", "snapshot snapshot", "install install", "unit unit", "serve serve"} <= set(seen)
