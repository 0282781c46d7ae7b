"""Hostile host trees: truncated, binary, huge and contradictory sysfs/procfs files and unreadable
paths. Every check must end in a judged status (never an escaped exception, never `error`), and the
CLI must never print a traceback."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.hosts import FIXTURE_IDS, fixture_root, run_cli
from rocmdoctor.checks import host_facts, load_registry
from rocmdoctor.host import Host
from rocmdoctor.model import Status
from rocmdoctor.registry import Context
from rocmdoctor.report import build_report, load_schema

HUGE = 2 * 1024 * 1024
TARGETS = (
    "sys/class/kfd/kfd/topology/nodes/*/properties",
    "sys/class/kfd/kfd/topology/nodes/*/mem_banks/*/properties",
    "sys/devices/*/*/mem_info_*",
    "sys/devices/*/*/uevent",
    "sys/module/*/parameters/pages_limit",
    "sys/module/amdgpu/version",
    "proc/meminfo",
    "proc/modules",
    "proc/sys/kernel/osrelease",
    "proc/[0-9]*/status",
    "proc/[0-9]*/comm",
    "proc/[0-9]*/cmdline",
    "proc/net/tcp*",
    "etc/group",
    "etc/passwd",
    "etc/os-release",
)
CONTRADICTIONS = (
    b"gfx_target_version 110501\ngfx_target_version 0\n",
    b"gfx_target_version 999999\nsimd_count -4\nsimd_per_cu 0\nnum_xcc 0\n",
    b"gfx_target_version 110501\ndrm_render_minor -1\nlocation_id 99999999\ndomain -7\n",
    b"gfx_target_version 110501\nsimd_count 80\nsimd_per_cu 2\ncwsr_size 1\nctl_stack_size 99999999999999999999\n",
    b"-1\n",
    b"0x\n",
    b"18446744073709551616\n",
    b"PCI_SLOT_NAME=\nPCI_ID=zz:zz\n=\n",
    b"MemTotal: 10 kB\nMemAvailable: 999999999999 kB\n",
    b"render:x:notanumber:user\n:::\n",
    b"user:x:1000:1000\n",
    b"PPid:\t-3\n",
    b"  sl  local_address\n 0: 0:1F40 0:0 0A x x x x x zz\n",
)


def targets(root: Path) -> list[Path]:
    found: list[Path] = []
    for pattern in TARGETS:
        found.extend(p for p in sorted(root.glob(pattern)) if p.is_file() and not p.is_symlink())
    return found


@st.composite
def damage(draw):
    kind = draw(
        st.sampled_from(
            ["truncate", "binary", "huge", "contradict", "directory", "dangling", "fifo", "empty"]
        )
    )
    if kind == "truncate":
        return kind, draw(st.floats(0, 1))
    if kind == "binary":
        return kind, draw(st.binary(min_size=1, max_size=512))
    if kind == "contradict":
        return kind, draw(st.sampled_from(CONTRADICTIONS))
    return kind, None


def apply(path: Path, kind: str, arg) -> None:
    data = path.read_bytes()
    path.unlink()
    if kind == "truncate":
        path.write_bytes(data[: int(len(data) * arg)])
    elif kind == "binary":
        path.write_bytes(arg)
    elif kind == "huge":
        path.write_bytes((data or b"x") * (HUGE // max(1, len(data)) + 1))
    elif kind == "contradict":
        path.write_bytes(arg)
    elif kind == "directory":
        path.mkdir()  # a directory where a file is expected: even root cannot read it as text
    elif kind == "dangling":
        path.symlink_to(path.parent / "does-not-exist")
    elif kind == "fifo":
        os.mkfifo(path)  # the Host opens with O_NONBLOCK, so a FIFO without a writer must not hang
    else:
        path.write_bytes(b"")


def run_all(root: Path) -> dict:
    ctx = Context(Host(root))
    registry = load_registry()
    outcomes = registry.run(ctx, registry.select(include_optional=False))
    return build_report(str(root), host_facts(ctx), outcomes)


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    fixture_id=st.sampled_from(FIXTURE_IDS),
    picks=st.lists(st.tuples(st.integers(0, 10_000), damage()), min_size=1, max_size=4),
)
def test_every_check_judges_a_damaged_tree(tmp_path_factory, fixture_id, picks):
    root = tmp_path_factory.mktemp("checks-bad") / fixture_id
    shutil.copytree(fixture_root(fixture_id), root, symlinks=True)
    candidates = targets(root)
    for index, (kind, arg) in picks:
        path = candidates[index % len(candidates)]
        if path.is_file() and not path.is_symlink():
            apply(path, kind, arg)
    report = run_all(root)
    jsonschema.Draft202012Validator(load_schema()).validate(report)
    errors = {c["id"]: c["summary"] for c in report["checks"] if c["status"] == Status.ERROR.value}
    assert not errors, errors


@pytest.mark.parametrize("kind", ["huge", "directory", "dangling", "fifo", "binary"])
def test_cli_prints_no_traceback_on_a_damaged_tree(tmp_path, kind):
    root = tmp_path / "host"
    shutil.copytree(fixture_root("strix-halo-nocwsr-dkms"), root, symlinks=True)
    for path in targets(root):
        apply(path, kind, os.urandom(64))
    for args in (("check",), ("check", "--json"), ("fix-kernel",), ("snapshot", str(tmp_path / "s.tar.gz"))):
        proc = run_cli(*args, root=root, env={"NO_COLOR": "1"})
        assert proc.returncode in (0, 1, 2), (args, proc.stderr)
        assert "Traceback" not in proc.stderr + proc.stdout, (args, proc.stderr)
