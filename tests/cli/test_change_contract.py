"""Every command that changes a host, under --check --json: nothing written (the tree byte-identical,
links and modes included), the one change envelope (src/rocmdoctor/schema/change.schema.json), and
`changed`/`diff` right in both directions: "would change" before, converged after the real run. For
people, the same --check ends in the one rendering of a Change (rendering/change_text.py): the
envelope's message, then `changed=`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from harness.cli import rocmdoctor
from harness.hosts import two_instance_layout
from harness.trees import account_root, tree_state
from rocmdoctor.report import load_schema

CHANGE = jsonschema.Draft202012Validator(load_schema("change.schema.json"))
T1, T2 = "vllm0.1.0-rocm7.0.0-gfx1151", "vllm0.2.0-rocm7.0.0-gfx1151"


def envelope_of(done: Any) -> dict[str, Any]:
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    CHANGE.validate(doc)
    return doc


def assert_rendered(done: Any, doc: dict[str, Any]) -> None:
    """The people-facing output of a --check: the envelope's message and `changed=` close it."""
    assert done.returncode == 0, done.stdout + done.stderr
    closing = f"{doc['msg']}\nchanged={str(doc['changed']).lower()}"
    assert done.stdout.rstrip("\n").endswith(closing), done.stdout


def assert_contract(watched: Path, run: Callable[..., Any], apply: tuple[str, ...] = ()) -> None:
    """--check first (would change, writes nothing), the real run (`apply`: the flag that makes a
    command write rather than show), then --check again (converged)."""
    before = tree_state(watched)
    planned = envelope_of(run("--check", "--json"))
    assert tree_state(watched) == before, "a --check run wrote"
    assert planned["check"] is True and planned["changed"] is True and planned["diff"], planned
    assert_rendered(run("--check"), planned)
    assert tree_state(watched) == before, "a --check run wrote"
    done = envelope_of(run(*apply, "--json"))
    assert done["check"] is False and done["changed"] is True, done
    after = tree_state(watched)
    again = envelope_of(run("--check", "--json"))
    assert again["changed"] is False and tree_state(watched) == after, again
    assert_rendered(run("--check"), again)
    assert envelope_of(run(*apply, "--json"))["changed"] is False


def test_unit(tmp_path: Path):
    root = account_root(tmp_path)
    model = ("--model", "/srv/models/tiny", "--gpu-memory-utilization", "0.8", "--", "--enforce-eager")
    assert_contract(
        root,
        lambda *flags: rocmdoctor("unit", *flags, "--target", str(root), *model, root=root),
        ("--write",),
    )


def test_instances(tmp_path: Path):
    root = account_root(tmp_path)
    layout = (*two_instance_layout(), "--model", "/srv/models/tiny", "--port", "18000")
    assert_contract(
        root,
        lambda *flags: rocmdoctor("instances", *flags, "--target", str(root), *layout, root=root),
        ("--write",),
    )


def test_lock_install_rollback_and_prune(install_lab):
    lab = install_lab
    built = {tag: lab.bundle(tag) for tag in (T1, T2)}
    lab.pin("gfx1151", built[T1])  # the release server's newest is T2: a refresh moves the pin
    prefix = ("--prefix", str(lab.prefix))
    pins = ("--bundles-dir", str(lab.pins), "--family", "gfx1151", "--connect-timeout", "2")
    assert_contract(lab.root, lambda *flags: lab.cli("bundle", "lock", *prefix, *pins, *flags))
    lab.pin("gfx1151", built[T1])
    lab.prefix.mkdir()
    assert_contract(lab.root, lambda *flags: lab.install("gfx1151", *flags))
    lab.pin("gfx1151", built[T2])
    assert_contract(lab.root, lambda *flags: lab.install("gfx1151", *flags))
    assert_contract(lab.root, lambda *flags: lab.cli("rollback", *prefix, "--to", T1, *flags))
    assert_contract(lab.root, lambda *flags: lab.cli("bundle", "prune", *prefix, "--keep", "1", *flags))


@pytest.mark.parametrize("command", ["unit", "instances"])
def test_check_alone_needs_no_write_flag_and_says_so_in_text(tmp_path: Path, command: str):
    root = account_root(tmp_path)
    args = ("--model", "/srv/models/tiny") + (
        ("--gpu-memory-utilization", "0.8") if command == "unit" else tuple(two_instance_layout())
    )
    before = tree_state(root)
    done = rocmdoctor(command, "--check", "--target", str(root), *args, root=root)
    assert done.returncode == 0, done.stderr
    assert "would change" in done.stdout and "changed=true" in done.stdout
    assert tree_state(root) == before


def test_jit_cache_purge(tmp_path: Path):
    jit = tmp_path / "state/jit"
    for name in ("gfx1151-00aa", "gfx1151-11bb"):
        (jit / name / "triton").mkdir(parents=True)
        (jit / name / "triton" / "kernel.so").write_bytes(b"\x7fELF")
    args = (
        "bundle",
        "cache",
        "purge",
        "--prefix",
        str(tmp_path / "opt"),
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert_contract(tmp_path, lambda *flags: rocmdoctor(*args, *flags))
    assert list(jit.iterdir()) == []  # no current bundle: every cache was another bundle's
