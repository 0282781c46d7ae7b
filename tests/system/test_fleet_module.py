"""The role's module `rocmdoctor_command` run by the real Ansible (ad hoc, local connection) around a
real program that speaks rocmdoctor's JSON envelope: --check in check mode, a `{before, after}` diff
shown as Ansible's diff, staged files passed for one run and removed afterwards, bad names refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.fleet import ANSIBLE_PLAYBOOK, PLAYBOOKS
from harness.trees import account_root, tree_state

ANSIBLE = ANSIBLE_PLAYBOOK.parent / "ansible"
LIBRARY = PLAYBOOKS / "roles/rocmdoctor/library"
# Stands in for `rocmdoctor install`: reports what it was given (argv, the staged directory's files).
COMMAND = """
import json, os, sys
argv = sys.argv[1:]
staged = argv[argv.index("--bundles-dir") + 1] if "--bundles-dir" in argv else None
files = {n: open(os.path.join(staged, n)).read() for n in sorted(os.listdir(staged))} if staged else {}
print(json.dumps({"schema_version": 1, "changed": True, "msg": "would install t2",
                  "diff": {"before": {"current": None}, "after": {"current": "t2"}},
                  "argv": argv, "staged": staged, "files": [], "seen": files}))
"""


def run_module(tmp_path: Path, args: dict, *flags: str) -> tuple[int, str]:
    done = subprocess.run(
        [str(ANSIBLE), "localhost", "-c", "local", "-M", str(LIBRARY), "-m", "rocmdoctor_command"]
        + ["-a", json.dumps(args), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
            "ANSIBLE_LOCALHOST_WARNING": "0",
        },
    )
    return done.returncode, done.stdout + done.stderr


def result_of(output: str) -> dict:
    """The task's result: the JSON object after `=> `, whatever follows it (stderr is appended, and a
    library may warn there: cryptography 51 deprecates DSA, which ansible-core 2.19 imports)."""
    return json.JSONDecoder().raw_decode(output, output.index("=> {") + 3)[0]


def test_check_mode_stages_the_files_shows_the_diff_and_removes_them(tmp_path: Path):
    args = {
        "cli": [sys.executable, "-c", COMMAND],
        "command": ["install"],
        "args": ["--family", "gfx1151"],
        "stage": {"lock.json": '{"families": {}}\n', "manifest.toml": 'repo = "o/r"\n'},
        "stage_option": "--bundles-dir",
    }
    rc, out = run_module(tmp_path, args, "--check", "--diff")
    assert rc == 0, out
    # Ansible's own diff of the `{before, after}` state
    assert "-current: null" in out.splitlines() and '+current: "t2"' in out.splitlines(), out
    doc = result_of(out)["result"]
    assert doc["argv"][:4] == ["install", "--json", "--check", "--bundles-dir"]
    assert doc["argv"][-2:] == ["--family", "gfx1151"]
    assert doc["seen"] == args["stage"]  # byte for byte, trailing newlines kept
    assert not Path(doc["staged"]).exists()  # removed after the run

    rc, out = run_module(tmp_path, {**args, "stage": {}})
    assert rc == 0, out
    doc = result_of(out)["result"]
    assert doc["argv"] == ["install", "--json", "--family", "gfx1151"] and doc["staged"] is None


def test_a_staged_name_that_is_not_a_plain_file_name_is_refused(tmp_path: Path):
    for name in ("../escape", "a/b", ".."):
        rc, out = run_module(
            tmp_path,
            {
                "cli": [sys.executable, "-c", COMMAND],
                "command": ["install"],
                "stage": {name: "x"},
                "stage_option": "--bundles-dir",
            },
        )
        assert rc != 0 and "is not a plain file name" in out, out
    assert not (tmp_path / "escape").exists()
    rc, out = run_module(
        tmp_path, {"cli": [sys.executable, "-c", COMMAND], "command": ["install"], "stage": {"a": "b"}}
    )
    assert rc != 0 and "stage needs stage_option" in out, out


def test_check_mode_never_writes_when_command_or_args_hold_the_vllm_separator(tmp_path: Path):
    """The module's --json/--check go before a `--`: after it they would be vLLM's arguments, the
    "dry run" would write the unit (with `--check` in ExecStart) and create the account."""
    root = account_root(tmp_path)
    cli = [sys.executable, "-m", "rocmdoctor", "--root", str(root)]
    own = ["--target", str(root), "--model", "/srv/models/tiny", "--gpu-memory-utilization", "0.8"]
    cases = [
        {"command": ["unit", "--write", *own, "--", "--enforce-eager"], "args": []},
        {"command": ["unit", "--write"], "args": [*own, "--", "--enforce-eager", "--seed", "1"]},
        {"command": ["unit", "--write", *own, "--"], "args": ["--enforce-eager"]},
    ]
    before = tree_state(root)
    for case in cases:
        rc, out = run_module(tmp_path, {"cli": cli, **case}, "--check", "--diff")
        assert rc == 0, out
        result = result_of(out)
        cut = result["cmd"].index("--")
        assert {"--json", "--check"} <= set(result["cmd"][len(cli) : cut]), result["cmd"]
        assert {"--json", "--check"}.isdisjoint(result["cmd"][cut:]), result["cmd"]
        assert result["changed"] is True and result["result"]["check"] is True
        assert "+ExecStart=" in out and "--enforce-eager" in out and "--check" not in result["result"]["diff"]
        assert tree_state(root) == before, "a check-mode run wrote into the tree"
    # and for real, once: the unit carries the vLLM arguments and not the module's flags
    rc, out = run_module(tmp_path, {"cli": cli, **cases[1]})
    assert rc == 0 and result_of(out)["changed"] is True, out
    unit = (root / "etc/systemd/system/vllm.service").read_text()
    assert "--enforce-eager --seed 1" in unit and "--check" not in unit and "--json" not in unit
