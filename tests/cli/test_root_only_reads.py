"""`--root` only reads, on every command: the tree named by --root is byte-identical after any command
(a refusal says to pass --target); `--target T` writes only inside T."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.cli import rocmdoctor
from harness.hosts import fixture_root, two_instance_layout
from harness.trees import account_root, tree_state
from rocmdoctor.cli import COMMANDS

MODEL = ("--model", "/srv/models/tiny", "--gpu-memory-utilization", "0.8")


def host_tree(tmp_path: Path) -> Path:
    """A fixture's tree with the account databases a write would touch."""
    root = tmp_path / "host"
    shutil.copytree(fixture_root("mi308x-cpx"), root, symlinks=True)
    for name in ("shadow", "gshadow", "login.defs"):
        shutil.copy2(Path("/etc") / name, root / "etc" / name)
    return root


def every_command(out: Path) -> list[tuple[str, ...]]:
    """One invocation per command that could change something, each as it would write."""
    prefix = ("--prefix", str(out / "prefix"))
    return [
        ("check",),
        ("check", "--json", "--user", "ubuntu", "--prefix", "/srv/rd"),
        ("fix-kernel",),
        ("fix", "--yes"),
        ("fix", "--check", "--json"),
        ("snapshot", str(out / "host.tar.gz")),
        ("plan", "--offline", "--model", "Qwen/Qwen2.5-0.5B-Instruct"),
        ("unit", "--write", *MODEL),
        ("unit", "--check", *MODEL),
        ("instances", "--write", "--model", "/srv/models/tiny", *two_instance_layout()),
        ("unit", "--instances", "per-partition", "--write", "--model", "/srv/models/tiny"),
        ("bundles", *prefix),
        ("rollback", *prefix),
        ("bundle", "prune", *prefix),
        ("install", "--check", "--frozen", "--family", "gfx942", *prefix),
        ("upgrade", "--check", "--frozen", "--family", "gfx942", *prefix),
        ("tune", "--write", *MODEL),
        ("cluster", "facts", "--json", "--advertise", "10.0.0.1", *prefix),
        ("cluster", "unit", "--write", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
         "--advertise", "10.0.0.2", *MODEL),
        ("explain", str(Path(__file__).parents[1] / "fixtures/logs/rocm-libraries-1132-page-fault.log")),
    ]  # fmt: skip


def test_every_command_is_covered():
    named = {argv[0] for argv in every_command(Path("/nonexistent"))}
    # serve, smoke, bench and lemonade act on a server, not on a tree; `bundle` by its subcommands
    assert set(COMMANDS) - named <= {"serve", "smoke", "bench", "lemonade", "bundle"}, set(COMMANDS) - named


@pytest.mark.parametrize("argv", every_command(Path("/OUT")), ids=lambda a: " ".join(a[:2]))
def test_root_is_never_written(tmp_path: Path, argv: tuple[str, ...]):
    root = host_tree(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    argv = tuple(str(out / a[len("/OUT/") :]) if a.startswith("/OUT/") else a for a in argv)
    before = tree_state(root)
    done = rocmdoctor(
        *argv, root=root, env={"ROCMDOCTOR_GITHUB_API": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"}
    )
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    assert tree_state(root) == before, f"{' '.join(argv)} wrote into --root"
    if "--write" in argv:
        assert done.returncode == 2 and f"pass --target {root}" in done.stderr, done.stderr


@pytest.mark.parametrize("command", ["unit", "instances"])
def test_target_is_written_and_nothing_else(tmp_path: Path, command: str):
    root = host_tree(tmp_path)
    target = account_root(tmp_path / "image")
    args = MODEL if command == "unit" else ("--model", "/srv/models/tiny", *two_instance_layout())
    before = tree_state(root)
    done = rocmdoctor(command, "--write", "--target", str(target), *args, root=root)
    assert done.returncode == 0, done.stderr
    assert tree_state(root) == before
    written = [p for p in target.rglob("*") if p.is_file() and "systemd" in str(p)]
    assert written and all(p.is_relative_to(target) for p in written)
    assert (target / "etc/systemd/system").is_dir()
