"""The identity rule (rocmdoctor.process_identity) over captured /proc trees: what makes a process vLLM
is its executable, its entry module or console script, its control group or parent chain, never a
substring of its command line or a title alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.hosts import fixture_root
from rocmdoctor.host import Host
from rocmdoctor.process_identity import process_table, python_entry, vllm_reason

PY = "/opt/rocm-vllm/bin/python3.12"


@pytest.mark.parametrize(
    ("argv", "entry"),
    [
        ((PY, "-m", "vllm.entrypoints.openai.api_server"), ("module", "vllm.entrypoints.openai.api_server")),
        ((PY, "-I", "-W", "ignore", "-mvllm.entrypoints.cli.main"), ("module", "vllm.entrypoints.cli.main")),
        ((PY, "-Wignore", "-X", "dev", "-u", "x.py", "-m", "vllm.entrypoints"), ("script", "x.py")),
        ((PY, "-c", "pass", "-m", "vllm.entrypoints.openai.api_server"), ("command", "pass")),
        ((PY, "watch.py", "--match", "vllm.entrypoint"), ("script", "watch.py")),
        ((PY, "--check-hash-based-pycs", "always", "-m", "m"), ("module", "m")),
        ((PY, "-"), ("stdin", "-")),
        ((PY, "-I"), None),
    ],
)
def test_python_command_lines_are_parsed_as_python_parses_them(argv, entry):
    assert python_entry(argv) == entry


def proc(root: Path, pid: int, argv: list[str], exe: str, ppid: int, cgroup: str = "/user.slice") -> None:
    d = root / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    fields = ["S", str(ppid)] + ["0"] * 17 + [str(1000 + pid)]
    (d / "stat").write_text(f"{pid} ({os.path.basename(argv[0])[:15]}) {' '.join(fields)} 0 0\n")
    (d / "status").write_text(f"Name:\tx\nPPid:\t{ppid}\nUid:\t0\t0\t0\t0\n")
    (d / "cgroup").write_text(f"0::{cgroup}\n")
    os.symlink(exe, d / "exe")


def verdicts(root: Path) -> dict[int, str | None]:
    host = Host(root)
    table = process_table(host)
    return {pid: vllm_reason(host, facts, table) for pid, facts in table.items()}


def test_entry_module_title_parent_chain_and_unit(tmp_path):
    proc(tmp_path, 10, [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], PY, 1)
    proc(tmp_path, 11, ["VLLM::EngineCore"], PY, 10)  # its API server is alive: a descendant
    proc(tmp_path, 20, ["VLLM::EngineCore"], PY, 1, "/system.slice/vllm@a.service")  # in a vLLM unit
    proc(tmp_path, 21, ["VLLM::Worker"], PY, 1)  # orphaned, nothing says vLLM but the title
    proc(tmp_path, 22, ["VLLM::EngineCore"], "/usr/bin/sleep", 1, "/system.slice/vllm.service")
    proc(tmp_path, 30, ["tail", "-F", "/var/log/vllm"], "/usr/bin/tail", 1)
    proc(tmp_path, 31, ["sh", "-c", "pgrep -f VLLM"], "/usr/bin/dash", 1)
    proc(tmp_path, 32, [PY, "watch.py", "--match", "vllm.entrypoint"], PY, 1)
    proc(
        tmp_path,
        33,
        ["/usr/bin/vllm-wrapper", "-m", "vllm.entrypoints.openai.api_server"],
        "/usr/bin/bash",
        1,
    )
    got = verdicts(tmp_path)
    assert got[10] == "python3.12 -m vllm.entrypoints.openai.api_server"
    assert got[11] == "VLLM::EngineCore under 10 (python3.12)"
    assert got[20] == "VLLM::EngineCore in vllm@a.service's control group"
    assert [got[p] for p in (21, 22, 30, 31, 32, 33)] == [None] * 6


def test_console_script_is_judged_by_the_file_it_runs(tmp_path):
    bin_dir = tmp_path / "opt" / "v" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "vllm").write_text(
        "#!/opt/v/bin/python3\nimport sys\nfrom vllm.entrypoints.cli.main import main\n"
    )
    (tmp_path / "opt" / "fake").mkdir()
    (tmp_path / "opt" / "fake" / "vllm").write_text("import time\ntime.sleep(600)\n")
    proc(tmp_path, 40, ["/opt/v/bin/python3", "/opt/v/bin/vllm", "serve", "m"], "/opt/v/bin/python3", 1)
    proc(tmp_path, 41, ["/opt/v/bin/python3", "/opt/fake/vllm", "serve", "m"], "/opt/v/bin/python3", 1)
    got = verdicts(tmp_path)
    assert got[40] == "python3 running vLLM's console script /opt/v/bin/vllm"
    assert got[41] is None


def test_a_captured_title_without_its_executable_is_not_judged_vllm():
    """The mi300x capture's orphaned VLLM::EngineCore has no /proc/PID/exe (captured before the rule):
    nothing but its title says vLLM, so its report no longer calls it an orphaned engine (golden updated)."""
    got = verdicts(fixture_root("mi300x"))
    assert got[13673] is None
