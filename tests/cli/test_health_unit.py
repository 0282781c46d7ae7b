"""rocmdoctor-health.service and .timer: systemd's own checks pass, the service is fenced in like the
server's unit, and `unit --write` / `instances --write` write both beside the server's units."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from click.testing import CliRunner

from harness.hosts import fixture_root
from rocmdoctor.cli import cli
from rocmdoctor.provision.server.health_unit import (
    SERVICE_NAME,
    TEXTFILE,
    TIMER_NAME,
    health_units,
    rocmdoctor_path,
)
from rocmdoctor.provision.server.unit import command_line

MAX_EXPOSURE = 3.5  # as the server's unit (tests/cli/test_unit.py)


def written(tmp_path: Path) -> dict[str, Path]:
    prefix = tmp_path / "opt" / "rocmdoctor"
    tool = Path(rocmdoctor_path(str(prefix)))
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    out = {}
    for path, content in health_units(str(prefix), str(units), command_line):
        Path(path).write_text(content)
        out[Path(path).name] = Path(path)
    return out


def test_the_units_pass_systemd_analyze_verify_silently(tmp_path):
    units = written(tmp_path)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(units[SERVICE_NAME]), str(units[TIMER_NAME])],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_the_service_is_fenced_in_and_writes_only_the_textfile_directory(tmp_path):
    units = written(tmp_path)
    done = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(units[SERVICE_NAME])],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    level = re.search(r"Overall exposure level for rocmdoctor-health.service: ([\d.]+)", done.stdout)
    assert level, done.stdout + done.stderr
    assert float(level.group(1)) <= MAX_EXPOSURE
    lines = units[SERVICE_NAME].read_text().splitlines()
    assert "ProtectSystem=strict" in lines and "Type=oneshot" in lines
    assert f"ReadWritePaths={TEXTFILE.rsplit('/', 1)[0]}" in lines
    exec_start = next(line for line in lines if line.startswith("ExecStart="))
    assert exec_start.endswith(f"check --prefix {tmp_path}/opt/rocmdoctor --textfile {TEXTFILE}")
    assert "OnUnitActiveSec=2min" in units[TIMER_NAME].read_text().splitlines()


def test_unit_write_and_instances_write_write_the_health_timer(tmp_path):
    for command in (["unit", "--write"], ["instances", "--write", "--instances", "per-partition"]):
        root = tmp_path / command[0]
        shutil.copytree(fixture_root("mi308x-cpx"), root, symlinks=True)
        done = CliRunner().invoke(
            cli,
            ["--root", str(root), *command, "--target", str(root), "--model", "/srv/models/tiny", "--user", "vllm",
             "--gpu-memory-utilization", "0.8"],
        )  # fmt: skip
        assert done.exit_code == 0, done.output
        unit_dir = root / "etc/systemd/system"
        assert (unit_dir / SERVICE_NAME).is_file() and (unit_dir / TIMER_NAME).is_file(), command
        again = CliRunner().invoke(
            cli,
            ["--root", str(root), *command, "--target", str(root), "--model", "/srv/models/tiny", "--user", "vllm",
             "--gpu-memory-utilization", "0.8", "--json"],
        )  # fmt: skip
        assert '"changed": false' in again.output, again.output
