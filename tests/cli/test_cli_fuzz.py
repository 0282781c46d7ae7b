"""Hostile values for every option of every command that reads a host or plans a change.

Whatever the option and the value (NaN, infinities, negatives, huge numbers, empty strings, strings
that look like options, control characters, paths that are FIFOs, devices or links), a command ends
with a documented exit code (0, 1 or 2), never a traceback and never "internal error", and within a
bound generous for a loaded 2-core machine. The options are read from the commands themselves, so a
new option is fuzzed without touching this file. Commands that change a host run with --check or on
a private copy of a fixture; `serve`, `smoke` and `bench` have their own fuzz test against misbehaving
servers (tests/cli/test_misbehaving_servers_fuzz.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import HOSTS
from rocmdoctor.cli import cli

BOUND_S = 60.0
# Command -> words that keep it from changing anything outside the test's own folders.
COMMANDS = {
    "check": [],
    "fix-kernel": [],
    "plan": ["--offline"],
    "unit": [],
    "instances": [],
    "bundles": [],
    "rollback": ["--check"],
    "install": ["--check", "--frozen"],
}
HOSTILE = [
    "nan",
    "inf",
    "-inf",
    "-1",
    "0",
    "1e30",
    "99999999999999999999",
    "-5",
    "0.004",
    "",
    " ",
    "-h",
    "--",
    "--help",
    "a b",
    "+/opt/rd",
    "opt/rd",
    "/",
    "..",
    "\x01",
    "a\nb",
    "é",
    "1e-30",
    "x" * 5000,
    "auto",
    "per-gpu",
    "/dev/zero",
    "{fifo}",
    "{link}",
    "gfx1151",
    "vllm0.0.0-rocm0.0.0-gfx1151",
    "-- --api-ke SECRET",
]


def options_of(name: str) -> list[str]:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    return sorted(
        opt
        for param in command.params
        if isinstance(param, click.Option) and not param.is_flag and param.name not in ("help",)
        for opt in param.opts
        if opt.startswith("--") and opt != "--root"
    )


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(HOSTS / "strix-halo-clean", work / "root", symlinks=True)
    os.mkfifo(work / "fifo")
    (work / "link").symlink_to("/etc/shadow")
    return work


@settings(
    max_examples=int(os.environ.get("ROCMDOCTOR_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
def test_no_option_value_breaks_a_command(workspace, data):
    name = data.draw(st.sampled_from(sorted(COMMANDS)))
    options = options_of(name)
    argv = [sys.executable, "-m", "rocmdoctor", "--root", str(workspace / "root"), name, *COMMANDS[name]]
    argv += ["--prefix", str(workspace / "prefix")] if "--prefix" in options else []
    argv += ["--model", "m"] if name in ("unit", "plan", "instances") else []
    for option in data.draw(st.lists(st.sampled_from(options), min_size=1, max_size=3, unique=True)):
        value = data.draw(st.sampled_from(HOSTILE))
        argv += [option, value.format(fifo=workspace / "fifo", link=workspace / "link")]
    env = {
        **os.environ,
        "HOME": str(workspace),
        "HF_HUB_OFFLINE": "1",
        "ROCMDOCTOR_GITHUB_API": "http://127.0.0.1:9",
    }
    started = time.monotonic()
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=BOUND_S + 30, env=env, stdin=subprocess.DEVNULL
    )
    elapsed = time.monotonic() - started
    output = done.stdout + done.stderr
    assert done.returncode in (0, 1, 2), (argv, output[-2000:])
    assert "Traceback" not in output and "internal error" not in output, (argv, output[-2000:])
    assert elapsed < BOUND_S, (argv, elapsed)
    assert not (workspace / "root" / "etc" / "systemd").exists()  # --root only reads
    assert "SECRET" not in done.stdout
