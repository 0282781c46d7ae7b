"""Effects have one owner: nothing outside the seam modules calls a file-changing, atomic-write or
process-signal primitive (os.unlink/rename/mkdir/symlink/chmod/kill..., shutil.rmtree/move/copy...,
pathlib's write_text/unlink/mkdir/chmod/touch/rename, open() for writing, atomic.write_atomic /
atomic_file, send_signal/terminate/pidfd_send_signal). A change goes through `HostWriter` (its
methods, `writer.trees` for a bundle prefix) and a signal through `host_processes`.

ALLOWED lists what remains, each with its reason and its count: a new call fails, and so does an entry
that no longer matches (remove it), so the list can only shrink."""

from __future__ import annotations

import ast
from collections import Counter

from conftest import REPO

SEAM = {
    "src/rocmdoctor/host_writes.py",  # HostWriter, OwnedTrees: the write seam
    "src/rocmdoctor/host_files.py",  # the tree operations HostWriter.trees makes
    "src/rocmdoctor/atomic.py",  # the atomic writer the seam uses
    "src/rocmdoctor/host_processes.py",  # processes: run, stop, signal
    "src/rocmdoctor/host_removal.py",  # removal of a tree by directory fds, no link followed (OwnDir)
}
ALLOWED: dict[tuple[str, str], tuple[int, str]] = {
    ("provision/server/stop_leftovers.py", "signal.pidfd_send_signal"): (
        1,
        "runs standalone as the unit's ExecStartPre on the bundle's Python: cannot import rocmdoctor",
    ),
    ("provision/server/stop_leftovers.py", "os.kill"): (1, "the same standalone ExecStartPre"),
    ("src/rocmdoctor/archive/tar_rule.py", "os.link"): (
        1,
        "the member writer: by directory fd, no link followed",
    ),
    ("src/rocmdoctor/archive/tar_rule.py", "os.fchmod"): (1, "the member writer"),
    ("src/rocmdoctor/archive/tar_rule.py", "os.mkdir"): (2, "the member writer"),
    ("src/rocmdoctor/archive/tar_rule.py", "os.symlink"): (1, "the member writer"),
    ("src/rocmdoctor/host.py", "os.killpg"): (
        1,
        "Host.run's deadline: the read seam kills the process group of the probe it started",
    ),
}

OS_CALLS = {
    "unlink", "remove", "rename", "renames", "replace", "rmdir", "removedirs", "mkdir", "makedirs",
    "symlink", "link", "chmod", "fchmod", "chown", "fchown", "lchown", "truncate", "mkfifo", "kill", "killpg",
}  # fmt: skip
SHUTIL_CALLS = {"rmtree", "move", "copy", "copy2", "copyfile", "copytree", "chown"}
PATH_CALLS = {"write_text", "write_bytes", "unlink", "mkdir", "rmdir", "symlink_to", "hardlink_to", "chmod", "touch", "rename"}  # fmt: skip
SIGNAL_METHODS = {"send_signal", "terminate", "pidfd_send_signal"}
ATOMIC_CALLS = {"write_atomic", "atomic_file"}
# Receivers that are the seam itself: a HostWriter `writer`, its `trees`, a `host`.
SEAM_RECEIVERS = {"writer", "trees", "host"}


def _receiver(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name):
            return node.attr if node.value.id in ("self", "layout") else node.value.id
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def primitive(call: ast.Call) -> str | None:
    """The primitive `call` makes, or None."""
    func = call.func
    if isinstance(func, ast.Name):
        if func.id in ATOMIC_CALLS:
            return func.id
        mode = (
            call.args[1]
            if len(call.args) > 1
            else next((k.value for k in call.keywords if k.arg == "mode"), None)
        )
        if func.id == "open" and isinstance(mode, ast.Constant) and set(str(mode.value)) & set("wax+"):
            return "open(w)"
        return None
    if not isinstance(func, ast.Attribute):
        return None
    base = func.value.id if isinstance(func.value, ast.Name) else None
    if base == "os" and func.attr in OS_CALLS:
        return f"os.{func.attr}"
    if base == "shutil" and func.attr in SHUTIL_CALLS:
        return f"shutil.{func.attr}"
    if base == "signal" and func.attr == "pidfd_send_signal":
        return "signal.pidfd_send_signal"
    if _receiver(func.value) in SEAM_RECEIVERS:
        return None
    if func.attr in ATOMIC_CALLS:
        return func.attr
    if func.attr in PATH_CALLS or func.attr in SIGNAL_METHODS:
        return f".{func.attr}()"
    if func.attr == "replace" and len(call.args) == 1 and not call.keywords:  # Path.replace, not str's
        return ".replace()"
    return None


def found_primitives() -> Counter[tuple[str, str]]:
    found: Counter[tuple[str, str]] = Counter()
    trees = [REPO / "src" / "rocmdoctor", REPO / "checks", REPO / "provision"]
    for path in sorted(p for tree in trees for p in tree.rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel in SEAM:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
            if isinstance(node, ast.Call) and (name := primitive(node)):
                found[(rel, name)] += 1
    return found


def test_only_the_seam_calls_file_atomic_write_and_signal_primitives():
    found = found_primitives()
    new = {k: n for k, n in found.items() if n > ALLOWED.get(k, (0, ""))[0]}
    assert not new, f"make these changes through HostWriter / writer.trees / host_processes: {new}"
    stale = {k: (n, found.get(k, 0)) for k, (n, _) in ALLOWED.items() if found.get(k, 0) != n}
    assert not stale, f"fewer calls than allowed (shrink ALLOWED): {stale}"


def test_the_scanner_sees_each_kind_of_primitive():
    """The rule could pass by seeing nothing: each kind it forbids is found in a sample."""
    sample = """
import os, shutil, signal
os.unlink(p); shutil.rmtree(p); signal.pidfd_send_signal(fd, 9); write_atomic(p, b"")
path.write_text("x"); proc.send_signal(15); open(p, "wb"); path.replace(other)
writer.write_file(p, b""); layout.trees.remove(p); "a".replace("a", "b"); open(p)
"""
    names = [primitive(n) for n in ast.walk(ast.parse(sample)) if isinstance(n, ast.Call)]
    assert sorted(filter(None, names)) == sorted(
        ["os.unlink", "shutil.rmtree", "signal.pidfd_send_signal", "write_atomic", ".write_text()",
         ".send_signal()", "open(w)", ".replace()"]
    )  # fmt: skip
