"""Secrets never reach bug-report material, and the one API-key reader refuses what would hang or flood it.

Every form a key takes in the wild is planted in a real /proc-shaped tree (and the live process table),
then `check --json` and `snapshot` must not carry it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from harness.cli import rocmdoctor as run_in_process
from rocmdoctor.sensitive import (
    KeyFileError,
    read_api_key,
    redact_argv,
    redact_cmdline,
    redact_env,
    redact_text,
)

KEY = "sk-LEAKED0123456789"

# argv -> the argv a report may show (the same length: words are replaced, never dropped)
ARGV_CASES = [
    (["vllm", "serve", "m", "--api-key", KEY], ["vllm", "serve", "m", "--api-key", "***"]),
    (["vllm", "serve", "--api-ke", KEY, "--port", "1"], ["vllm", "serve", "--api-ke", "***", "--port", "1"]),
    (["vllm", "serve", "--api-key=" + KEY], ["vllm", "serve", "--api-key=***"]),
    (["vllm", "serve", "--api_key=" + KEY], ["vllm", "serve", "--api_key=***"]),
    (["vllm", "serve", "--api-key", KEY, "second" + KEY], ["vllm", "serve", "--api-key", "***", "***"]),
    (["vllm", "serve", "--api-key", "two words " + KEY], ["vllm", "serve", "--api-key", "***"]),
    (["vllm", "serve", "--api-key=two words " + KEY], ["vllm", "serve", "--api-key=***"]),
    (["vllm", "serve", "--hf-token", "hf_" + KEY], ["vllm", "serve", "--hf-token", "***"]),
    (["vllm", "serve", "--hf-t", "hf_" + KEY], ["vllm", "serve", "--hf-t", "***"]),
    (["tool", "--token=" + KEY], ["tool", "--token=***"]),
    (["tool", "--db-password", KEY], ["tool", "--db-password", "***"]),
    (["sudo", "VLLM_API_KEY=" + KEY, "vllm", "serve"], ["sudo", "VLLM_API_KEY=***", "vllm", "serve"]),
    (
        ["env", "HF_TOKEN=" + KEY, "MY_SECRET_X=" + KEY, "PATH=/bin", "vllm"],
        ["env", "HF_TOKEN=***", "MY_SECRET_X=***", "PATH=/bin", "vllm"],
    ),
    (
        ["vllm", "serve", "--model", f"https://user:{KEY}@hf.example/m"],
        ["vllm", "serve", "--model", "https://***@hf.example/m"],
    ),
    (["vllm", "serve", f"https://{KEY}@hf.example/m"], ["vllm", "serve", "https://***@hf.example/m"]),
    (
        ["vllm", "serve", "m", "--port", "8000", "--enforce-eager"],
        ["vllm", "serve", "m", "--port", "8000", "--enforce-eager"],
    ),
]


@pytest.mark.parametrize(("argv", "shown"), ARGV_CASES)
def test_every_form_of_a_secret_in_argv_is_redacted(argv, shown):
    assert redact_argv(argv) == shown
    assert redact_cmdline("\x00".join(argv) + "\x00") == "\x00".join(shown) + "\x00"


@pytest.mark.parametrize(
    "text",
    [
        f"VLLM_API_KEY={KEY} vllm serve m",
        f"vllm serve m --api-key {KEY} --port 1",
        f"vllm serve m --api-ke={KEY}",
        f"vllm serve m --api-key '{KEY} tail'",
        f'vllm serve m --api-key "{KEY} tail"',
        f"HF_TOKEN={KEY} vllm serve https://u:{KEY}@host/x",
    ],
)
def test_a_shell_command_line_is_redacted(text):
    shown = redact_text(text)
    assert KEY not in shown and "tail" not in shown and "***" in shown
    in_argv = redact_argv(["sh", "-c", text])[2]
    assert KEY not in in_argv and "tail" not in in_argv


def test_environment_maps_lose_secret_values_only():
    env = {
        "HF_TOKEN": KEY,
        "VLLM_API_KEY": KEY,
        "AWS_SECRET_ACCESS_KEY": KEY,
        "GITHUB_TOKEN": KEY,
        "DB_PASSWORD": KEY,
        "HOME": "/root",
        "HF_ENDPOINT": f"https://u:{KEY}@mirror/",
        "KEYBOARD": "us",
    }
    shown = redact_env(env)
    assert KEY not in json.dumps(shown)
    assert shown["HOME"] == "/root" and shown["KEYBOARD"] == "us"
    assert shown["HF_ENDPOINT"] == "https://***@mirror/"


# -- the reports: a planted process in a --root tree ----------------------------------------------------


def rocmdoctor(*argv: str) -> subprocess.CompletedProcess:
    return run_in_process(*argv)


def proc_tree(tmp_path: Path) -> Path:
    """A root that holds vLLM processes started with every form of a key."""
    root = tmp_path / "root"
    (root / ".rocmdoctor").mkdir(parents=True)
    (root / ".rocmdoctor/env.json").write_text(json.dumps({"HOME": "/root", "HF_TOKEN": KEY}))
    for pid, (argv, _) in enumerate(ARGV_CASES, start=100):
        proc = root / "proc" / str(pid)
        proc.mkdir(parents=True)
        (proc / "comm").write_text("python3\n")
        # a vLLM server by its identity (process_identity): a Python interpreter running vLLM's entry module
        (proc / "exe").symlink_to("/usr/bin/python3.11")
        entry = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
        (proc / "cmdline").write_bytes(("\x00".join([*entry, *argv[1:]]) + "\x00").encode())
        (proc / "status").write_text("Name:\tvllm\nPPid:\t1\n")
    return root


def test_check_json_and_snapshot_carry_no_secret(tmp_path):
    root = proc_tree(tmp_path)
    done = rocmdoctor("--root", str(root), "check", "--json", "--only", "processes.*")
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    listed = report["checks"][0]["details"]["gpu_processes"] if "checks" in report else None
    assert KEY not in done.stdout and "two words" not in done.stdout
    assert listed is None or len(listed) == len(ARGV_CASES)
    out = tmp_path / "snap.tar.gz"
    snap = rocmdoctor("--root", str(root), "snapshot", str(out))
    assert snap.returncode == 0, snap.stderr
    with tarfile.open(out) as tar:
        for member in tar.getmembers():
            if member.isfile():
                data = tar.extractfile(member).read().decode(errors="replace")
                assert KEY not in data, member.name


def test_a_live_process_with_a_key_is_redacted_in_check_json(tmp_path):
    """The real process table: an interpreter running a module of vllm.entrypoints (what identifies a
    vLLM server), the key on its command line."""
    module = tmp_path / "vllm" / "entrypoints" / "sleeper.py"
    module.parent.mkdir(parents=True)
    module.write_text("import time\ntime.sleep(60)\n")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.sleeper", "--api-ke", KEY],
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    try:
        done = rocmdoctor("check", "--json", "--only", "processes.orphans")
    finally:
        server.kill()
        server.wait()
    assert KEY not in done.stdout
    assert str(server.pid) in done.stdout  # it was listed, with the key replaced


# -- the one API-key reader ----------------------------------------------------------------------------


def test_a_key_file_gives_its_one_key(tmp_path):
    path = tmp_path / "key"
    path.write_text("\n  " + KEY + "  \n\n")
    assert read_api_key(path) == KEY


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"\n\n", "is empty"),
        (b"a\nb\n", "holds 2 lines"),
        (b"two words\n", "characters from"),
        (b"\xff\xfe\x00k", "not UTF-8"),
        (b"k" * 5000, "larger than 4096 bytes"),
    ],
)
def test_a_bad_key_file_is_refused_with_the_reason(tmp_path, content, message):
    path = tmp_path / "key"
    path.write_bytes(content)
    with pytest.raises(KeyFileError, match=message):
        read_api_key(path)


def test_a_short_key_is_refused_where_the_server_is_started(tmp_path):
    path = tmp_path / "key"
    path.write_text("short\n")
    assert read_api_key(path) == "short"  # smoke/bench present what the server was started with
    with pytest.raises(KeyFileError, match="8-512"):
        read_api_key(path, min_length=8)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
@pytest.mark.parametrize("command", ["unit", "serve", "smoke", "bench"])
def test_a_key_file_that_never_ends_is_refused_quickly(tmp_path, kind, command):
    if kind == "fifo":
        path = tmp_path / "key"
        os.mkfifo(path)
    elif kind == "dev-zero":
        path = Path("/dev/zero")
    else:
        path = tmp_path
    argv = {
        "unit": ["unit", "--model", "m", "--gpu-memory-utilization", "0.5"],
        "serve": ["serve", "--model", "m", "--gpu-memory-utilization", "0.5", "--prefix", str(tmp_path)],
        "smoke": ["smoke", "--url", "http://127.0.0.1:9"],
        "bench": ["bench", "--url", "http://127.0.0.1:9"],
    }[command]
    started = time.monotonic()
    done = rocmdoctor(*argv, "--api-key-file", str(path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--api-key-file" in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < 20
