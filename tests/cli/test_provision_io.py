"""Provisioning does no file or process I/O of its own: everything goes through the seam in core.

Two proofs. Static: every `provision/*.py` is parsed and any direct file or process call (builtin
`open`, the `os` file and process functions, `subprocess`, `shutil`, `tempfile`, `fcntl`, `signal`,
`pathlib` I/O methods) fails with file:line and the seam call to use instead. Dynamic: install (from a
local mirror), a second install, rollback, `bundle fetch` into a new mirror, prune, `unit --write` and
`instances --write` run in
a process with an audit hook (`harness/io_recorder.py`), and no file or process event may have a
`rocmdoctor.provision` module as its nearest rocmdoctor frame.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from harness.bundles import build_bundle, write_pins
from harness.elf_bundle import family_code_objects
from harness.hosts import fixture_root

PROVISION = REPO / "provision"
RECORDER = REPO / "tests" / "harness" / "io_recorder.py"

# Modules that may stay outside the seam, each with its reason.
EXEMPT = {
    # Runs standalone on the bundle's own Python as the unit's ExecStartPost (shipped to libexec):
    # it cannot import rocmdoctor, so it cannot use the seam. It only talks HTTP to the local server.
    "wait_ready.py",
    # The same for ExecStartPre (libexec/stop-leftovers): it signals leftovers of the unit's own
    # control group, through pidfds, before the server starts.
    "stop_leftovers.py",
    # The same for a cluster worker's ExecStart (libexec/vllm-serve): it sets the bundle launcher's
    # environment by one re-exec and runs `vllm serve` in the bundle's Python.
    "vllm_serve.py",
}

SEAM_MODULES = {
    "rocmdoctor.host",
    "rocmdoctor.host_writes",
    "rocmdoctor.host_files",
    "rocmdoctor.host_processes",
    "rocmdoctor.rootfs",
    "rocmdoctor.atomic",
    "rocmdoctor.archive.tar_rule",
    "rocmdoctor.archive.extract",
    "rocmdoctor.archive.tar_pipe",
}

# What to use instead, per forbidden module.
FORBIDDEN_IMPORTS = {
    "subprocess": "host_processes.run_program / ProcessGroup (or Host.run)",
    "shutil": "host_files.remove_tree / host_files.replace",
    "tempfile": "atomic.write_atomic / HostWriter.write_file",
    "fcntl": "host_files.try_lock",
    "signal": "host_processes.SignalsToStop / ProcessGroup.stop",
    "ctypes": "host_files.exchange",
    "glob": "host_files.glob",
    "pty": "host_processes",
}
# os functions that are neither file nor process I/O.
OS_PURE = {
    "getpid",
    "geteuid",
    "getuid",
    "fspath",
    "fsencode",
    "fsdecode",
    "strerror",
    "cpu_count",
    "path.join",
    "path.abspath",
    "path.normpath",
    "path.basename",
    "path.dirname",
    "path.splitext",
    "path.isabs",
    "path.expanduser",
    "environ.get",
    "environ.copy",
    "environ.items",
}
OS_SEAM = {
    "open": "host_files.open_owned / open_plain, rootfs.read_regular",
    "replace": "host_files.replace",
    "rename": "host_files.replace",
    "readlink": "host_files.readlink",
    "path.realpath": "host_files.real_path",
    "path.lexists": "host_files.lexists",
    "path.exists": "host_files.exists",
    "path.isdir": "host_files.is_dir",
    "path.isfile": "host_files.is_file",
    "path.samefile": "host_files.same_file",
    "listdir": "host_files.list_dir",
    "walk": "host_files.tree_bytes (or a new host_files function)",
    "kill": "ProcessGroup.stop",
    "killpg": "ProcessGroup.stop",
    "symlink": "host_files.swap_symlink / HostWriter.symlink",
}
# pathlib methods that touch the file system (str.replace takes two arguments, Path.replace one).
PATH_IO = {
    "open": "host_files.open_owned / open_plain",
    "read_text": "rootfs.read_regular / host_files.shipped_text",
    "read_bytes": "rootfs.read_regular",
    "write_text": "HostWriter.write_file / atomic.write_atomic",
    "write_bytes": "HostWriter.write_file / atomic.write_atomic",
    "mkdir": "host_files.make_dirs",
    "unlink": "host_files.remove",
    "rmdir": "host_files.remove_tree",
    "touch": "HostWriter.write_file",
    "chmod": "HostWriter.chmod / host_files.add_exec_bits",
    "symlink_to": "host_files.swap_symlink",
    "hardlink_to": "host_files",
    "iterdir": "host_files.list_dir",
    "glob": "host_files.glob",
    "rglob": "host_files.glob",
    "stat": "host_files.size",
    "lstat": "host_files.size",
    "exists": "host_files.exists / lexists",
    "is_dir": "host_files.is_dir",
    "is_file": "host_files.is_file",
    "is_symlink": "host_files.is_link",
    "resolve": "host_files.real_path",
    "readlink": "host_files.readlink",
    "samefile": "host_files.same_file",
}
ONE_ARGUMENT_ONLY = {"replace": "host_files.replace", "rename": "host_files.replace"}
# Receivers whose methods are the seam: the project names a Host `host`, a HostWriter `writer` and its
# owned trees (`writer.trees`, a prefix's `layout.trees`) `trees`.
SEAM_OBJECTS = {"host", "writer", "trees"}


def _seam_aliases(tree: ast.AST) -> set[str]:
    """Names bound to a seam module in this file (`from .. import host_files as files`)."""
    seam = {m.rsplit(".", 1)[1] for m in SEAM_MODULES}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name in seam:
                    found.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in SEAM_MODULES and alias.asname:
                    found.add(alias.asname)
    return found


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def violations(source: str, filename: str) -> list[str]:
    """Each direct file or process operation in `source`, as `file:line: what; use instead`."""
    found = []

    def bad(node: ast.AST, what: str, instead: str) -> None:
        found.append(f"{filename}:{getattr(node, 'lineno', 0)}: {what}; use {instead} (rocmdoctor core)")

    tree = ast.parse(source, filename=filename)
    seam_receivers = _seam_aliases(tree) | SEAM_OBJECTS
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in FORBIDDEN_IMPORTS:
                    bad(node, f"imports {alias.name}", FORBIDDEN_IMPORTS[top])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            top = node.module.split(".")[0]
            if top in FORBIDDEN_IMPORTS:
                bad(node, f"imports from {node.module}", FORBIDDEN_IMPORTS[top])
            elif top == "os":
                for alias in node.names:
                    name = f"{node.module[3:] + '.' if '.' in node.module else ''}{alias.name}"
                    if name not in OS_PURE and alias.name != "environ":
                        bad(node, f"imports os {name}", OS_SEAM.get(name, "a host_files/host_processes call"))
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id == "open":
                bad(node, "calls open()", OS_SEAM["open"])
                continue
            dotted = _dotted(func)
            if dotted and dotted.startswith("os."):
                name = dotted[3:]
                if name not in OS_PURE:
                    bad(node, f"calls os.{name}()", OS_SEAM.get(name, "a host_files/host_processes call"))
                continue
            if isinstance(func, ast.Attribute):
                receiver = _dotted(func.value)
                if receiver is not None and receiver.rsplit(".", 1)[-1] in seam_receivers:
                    continue
                if func.attr in ONE_ARGUMENT_ONLY:
                    if len(node.args) == 1 and not node.keywords:
                        bad(node, f"calls .{func.attr}() on a path", ONE_ARGUMENT_ONLY[func.attr])
                elif func.attr in PATH_IO:
                    bad(node, f"calls .{func.attr}() on a path", PATH_IO[func.attr])
    return found


def provision_sources() -> list[Path]:
    return sorted(p for p in PROVISION.rglob("*.py") if p.name not in EXEMPT)


@pytest.mark.parametrize("path", provision_sources(), ids=lambda p: p.name)
def test_provision_module_does_no_io_of_its_own(path: Path):
    found = violations(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("snippet", "needle"),
    [
        ("with open(p) as f:\n    pass\n", "x.py:1: calls open(); use host_files.open_owned"),
        ("import shutil\n", "x.py:1: imports shutil; use host_files.remove_tree"),
        ("import subprocess as sp\n", "imports subprocess; use host_processes.run_program"),
        ("from subprocess import run\n", "imports from subprocess"),
        ("import os\n\nos.replace(a, b)\n", "x.py:3: calls os.replace(); use host_files.replace"),
        ("import os\nos.killpg(1, 9)\n", "calls os.killpg(); use ProcessGroup.stop"),
        ("from os import unlink\n", "imports os unlink"),
        ("from os.path import realpath\n", "imports os path.realpath; use host_files.real_path"),
        ("path.mkdir(parents=True)\n", "calls .mkdir() on a path; use host_files.make_dirs"),
        ("staging.replace(final)\n", "calls .replace() on a path; use host_files.replace"),
        ("Path('x').read_text()\n", "calls .read_text() on a path"),
        ("p.is_dir()\n", "calls .is_dir() on a path"),
        ("import fcntl\n", "imports fcntl; use host_files.try_lock"),
    ],
)
def test_the_static_rule_catches_a_violation(snippet: str, needle: str):
    found = violations(snippet, "x.py")
    assert any(needle in line for line in found), found


def test_the_static_rule_passes_what_is_not_io():
    clean = (
        "import os\n"
        "name = 'a%b'.replace('%', '%%')\n"
        "here = os.path.join(os.path.abspath('x'), 'y')\n"
        "pid = os.getpid()\n"
        "token = os.environ.get('HF_TOKEN')\n"
        "from .. import host_files as files\n"
        "files.is_dir(p)\n"
        "host.read_text('/proc/1/comm')\n"
    )
    assert violations(clean, "x.py") == []


# -- dynamic -------------------------------------------------------------------------------------------

TAG1, TAG2 = "vllm0.1.0-rocm7.0.0-gfx1151", "vllm0.2.0-rocm7.0.0-gfx1151"


def _tree(tag: str) -> dict:
    return {
        "bin/vllm-server": (b"#!/bin/sh\necho vllm-server stand-in\n", 0o755),
        "bin/python3": (f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'.encode(), 0o755),
        "lib/python3.13/site-packages/marker.txt": tag.encode(),
        # GPU code for the family: with no GPU of it here, install checks every ISA of the family
        **family_code_objects("gfx1151"),
    }


def record(tmp_path: Path, commands: list) -> dict:
    commands_file, out = tmp_path / "commands.json", tmp_path / "events.json"
    commands_file.write_text(json.dumps(commands))
    done = subprocess.run(
        [sys.executable, str(RECORDER), str(out), str(commands_file)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ROCMDOCTOR_GITHUB_API": "http://127.0.0.1:9"},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(out.read_text())


def _own_io(report: dict) -> list[str]:
    return [
        f"{e['module']}: {e['event']} {e['args']}"
        for e in report["events"]
        if e["module"].startswith("rocmdoctor.provision")
        and e["module"].rsplit(".", 1)[-1] + ".py" not in EXEMPT
    ]


def test_install_rollback_unit_and_instances_do_io_only_through_the_seam(tmp_path: Path):
    mirror, prefix, root = tmp_path / "mirror", tmp_path / "prefix", tmp_path / "root"
    builds = {tag: build_bundle(mirror, tag, _tree(tag), part_size=32 * 1024) for tag in (TAG1, TAG2)}
    for n, tag in enumerate((TAG1, TAG2)):
        write_pins(tmp_path / f"pins{n}", {"gfx1151": builds[tag]})
    (root / "etc").mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc/group").write_text("root:x:0:\n")
    install = ["install", "--family", "gfx1151", "--prefix", str(prefix), "--mirror", str(mirror)]
    report = record(
        tmp_path,
        [
            [*install, "--bundles-dir", str(tmp_path / "pins0"), "--json"],
            [*install, "--bundles-dir", str(tmp_path / "pins1"), "--extractor", "python", "--json"],
            ["rollback", "--prefix", str(prefix), "--json"],
            ["bundle", "prune", "--prefix", str(prefix), "--keep", "1", "--check", "--json"],
            [
                "bundle",
                "fetch",
                "--to",
                str(tmp_path / "mirror2"),
                "--mirror",
                str(mirror),
                "--bundles-dir",
                str(tmp_path / "pins1"),
                "--json",
            ],
            ["bundle", "prune", "--prefix", str(prefix), "--keep", "1", "--json"],
            [
                "--root",
                str(root),
                "unit",
                "--write",
                "--target",
                str(root),
                "--model",
                "/srv/m",
                "--gpu-memory-utilization",
                "0.8",
            ],
            [
                "--root",
                str(root),
                "instances",
                "--devices-from",
                str(fixture_root("mi308x-cpx")),
                "--instances",
                "per-partition",
                "--model",
                "/srv/m",
                "--write",
                "--target",
                str(root),
                "--port",
                "18000",
            ],
        ],
    )
    assert report["exits"] == [0] * 8, report["exits"]
    assert (prefix / "current").readlink() == Path("bundles") / TAG1  # the rollback happened
    assert [p.name for p in (prefix / "bundles").iterdir() if p.name[0] != "."] == [TAG1]  # pruned TAG2
    assert sorted(p.name for p in (tmp_path / "mirror2").iterdir()) == [a.name for a in builds[TAG2].assets]
    assert (root / "etc/systemd/system/vllm.service").is_file()
    assert (root / "etc/systemd/system/vllm@.service").is_file()
    assert not _own_io(report), "\n".join(_own_io(report))
    # The commands' I/O did happen, through the seam: the recorder saw it there.
    seen = set(report["by_module"])
    assert {"rocmdoctor.host_files", "rocmdoctor.host_writes", "rocmdoctor.archive.extract"} <= seen, seen
    assert {"rocmdoctor.host", "rocmdoctor.archive.tar_pipe", "rocmdoctor.atomic"} <= seen, seen


def test_the_recorder_catches_provision_code_doing_its_own_io(tmp_path: Path):
    target = tmp_path / "planted"
    report = record(
        tmp_path,
        [{"exec": f"open({str(target)!r}, 'w').close()", "as": "rocmdoctor.provision.rogue"}],
    )
    assert target.exists()
    assert any("rocmdoctor.provision.rogue: open" in line for line in _own_io(report)), report
