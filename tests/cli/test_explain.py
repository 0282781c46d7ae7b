"""`rocmdoctor explain` on real logs from public threads (tests/fixtures/logs/SOURCES.md), on host
fixtures (a cause confirmed, the same cause ruled out), on bad input, and within its bounds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading

import pytest

from conftest import FIXTURES, HOSTS
from harness.cli import rocmdoctor

LOGS = FIXTURES / "logs"
NO_GPU = HOSTS / "no-amd-gpu"  # checks cannot tell here: the corpus is judged on the log alone
CORPUS = [
    (row[0], row[2])
    for row in (
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in (LOGS / "SOURCES.md").read_text().splitlines()
        if line.startswith("| ") and ".log" in line
    )
]
# Lemonade's message when vLLM does not come up on gfx1151 without the fix (vllm_server.cpp), in lemond's
# line format (vllm-rocm#5): the table's own example of the cwsr signature.
CWSR_LINE = (
    "2026-05-08 11:50:25.741 [Error] (Router) Failed to load model: vllm-server failed to start within "
    "timeout. Your kernel may be missing the gfx1151 CWSR fix — see https://lemonade-server.ai/gfx1151_linux.html"
)


def explain_json(*args, root=NO_GPU, input=None):
    done = rocmdoctor("explain", "--json", *args, root=root, input=input)
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    assert report["exit_code"] == done.returncode and "schema_version" in report
    return report


def test_the_corpus_covers_every_file_and_some_unexplained_logs():
    assert sorted(name for name, _ in CORPUS) == sorted(p.name for p in LOGS.glob("*.log"))
    assert len(CORPUS) >= 15 and sum(cause == "-" for _, cause in CORPUS) >= 2


@pytest.mark.parametrize("name, cause", CORPUS, ids=[name for name, _ in CORPUS])
def test_explain_names_the_cause_the_thread_established_first(name, cause):
    report = explain_json(str(LOGS / name))
    assert report["exit_code"] == 1
    if cause == "-":
        assert report["causes"] == [] and report["unexplained"], report
        return
    first = report["causes"][0]
    assert first["id"] == cause, [c["id"] for c in report["causes"]]
    text = (LOGS / name).read_text().splitlines()
    for ev in first["evidence"]:
        assert ev["line"] is not None and text[ev["line"] - 1].strip().startswith(ev["text"][:60])


def test_the_cwsr_log_is_confirmed_on_a_kernel_without_the_export(tmp_path):
    log = tmp_path / "lemond.log"
    log.write_text("2026-05-08 11:50:19.001 [Info] (vLLM) Loading model...\n" + CWSR_LINE + "\n")
    cause = explain_json(str(log), root=HOSTS / "strix-halo-nocwsr-dkms")["causes"][0]
    assert cause["id"] == "cwsr" and cause["evidence"][0]["line"] == 2
    assert cause["host"]["verdict"] == "confirmed"
    assert {c["id"]: c["status"] for c in cause["host"]["checks"]}["kernel.cwsr"] == "fail"


def test_the_same_log_is_ruled_out_on_a_fixed_kernel_and_ranks_last(tmp_path):
    log = tmp_path / "lemond.log"
    log.write_text(
        CWSR_LINE
        + "\nCannot access gated repo for url https://huggingface.co/m/x/resolve/main/config.json.\n"
    )
    done = rocmdoctor("explain", str(log), root=HOSTS / "strix-halo-clean")
    assert done.returncode == 1
    report = explain_json(str(log), root=HOSTS / "strix-halo-clean")
    cwsr = report["causes"][-1]
    assert [c["id"] for c in report["causes"]] == ["hf-auth", "cwsr"]  # cwsr outranks it in the table
    assert cwsr["host"]["verdict"] == "ruled_out"
    assert "this log predates that or came from elsewhere" in cwsr["host"]["says"]
    assert "ruled out: the host passes kernel.cwsr" in done.stdout


def test_a_host_problem_without_a_check_and_a_non_host_problem_say_so():
    report = explain_json(str(LOGS / "sglang-14644-gated-repo.log"))
    assert report["causes"][0]["host"]["verdict"] == "no_check"
    assert "not a host problem" in report["causes"][0]["host"]["says"]


def test_a_clean_log_exits_0_and_stdin_is_read():
    done = rocmdoctor("explain", "-", root=NO_GPU, input=b"INFO 1\nINFO 2 ready\n")
    assert done.returncode == 0 and "Nothing wrong found" in done.stdout


def test_the_remedy_takes_the_length_that_fits():
    report = explain_json(str(LOGS / "vllm-2418-max-model-len.log"))
    assert "--max-model-len 3664" in report["causes"][0]["remedy"]


@pytest.mark.parametrize(
    "args, says",
    [
        ((), "give a log file"),
        (("/nonexistent/vllm.log",), "No such file"),
        ((str(LOGS),), "a directory"),
        (("/dev/zero",), "a device"),
        (("--unit", "-rf"), "not a systemd unit name"),
        (("--unit", "vllm"), "read this machine's journal"),
        (("--lemonade",), "read this machine's journal"),
    ],
)
def test_bad_input_exits_2_with_what_to_do(args, says):
    done = rocmdoctor("explain", *args, root=NO_GPU)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert says in done.stderr and "Traceback" not in done.stderr


def test_a_2_gb_log_is_read_at_both_ends_only(tmp_path):
    """A sparse file: 2 GB long, no 2 GB on disk. The cause at its very end is found."""
    log = tmp_path / "huge.log"
    size = 2 * 1024**3
    with open(log, "wb") as f:
        f.write(b"INFO starting\n")
        f.truncate(size)
        f.seek(size)
        f.write(b"\nOSError: [Errno 98] Address already in use\n")
    report = explain_json(str(log))
    source = report["sources"][0]
    assert source["bytes_read"] == 16 * 1024 * 1024 and "first and the last 8 MiB" in source["cut"]
    assert source["binary"] and source["skipped"][0]["bytes"] > size - 17 * 1024 * 1024
    ev = report["causes"][0]["evidence"][0]
    assert report["causes"][0]["id"] == "port-in-use" and ev["line"] is None and ev["offset"] == size + 1


def test_an_endless_stdin_is_cut_at_its_bound():
    """A generator feeds stdin for as long as it is read; the process boundary is the point here."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rocmdoctor", "--root", str(NO_GPU), "explain", "--json", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "ROCMDOCTOR_ROOT": ""},
    )
    line = b"(EngineCore_DP0 pid=1) INFO 11-27 00:00:00 [core.py:1] still serving requests\n"

    def feed():
        try:
            while True:
                proc.stdin.write(line * 4096)
        except (BrokenPipeError, ValueError, OSError):
            return

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    out = proc.stdout.read()  # communicate() would close stdin: that is an end, not an endless stream
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    report = json.loads(out)
    assert re.match(r"stopped after 16 MiB", report["sources"][0]["cut"])
    assert report["sources"][0]["bytes_read"] == 16 * 1024 * 1024


def test_a_hostile_log_cannot_drive_the_terminal(tmp_path):
    log = tmp_path / "evil\x1b[2J.log"
    log.write_bytes(b"\x1b]0;owned\x07OSError: [Errno 98] Address already in use \x1b[31mred\x1b[0m\x9b\n")
    done = rocmdoctor("explain", str(log), root=NO_GPU)
    assert done.returncode == 1 and "port-in-use" in done.stdout
    assert not any(c in done.stdout for c in "\x1b\x07\x9b")


def test_a_token_in_a_log_is_redacted_from_the_evidence(tmp_path):
    log = tmp_path / "hf.log"
    token = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"
    log.write_text(
        f"requests.exceptions.HTTPError: 401 Client Error: Unauthorized for url: https://huggingface.co/m (token {token})\n"
    )
    report = explain_json(str(log))
    text = report["causes"][0]["evidence"][0]["text"]
    assert report["causes"][0]["id"] == "hf-auth" and token not in text and "***" in text


def test_several_logs_give_one_list_in_priority_order_with_each_lines_log():
    oom, ipc = LOGS / "vllm-rocm-5-oom.log", LOGS / "rocm-systems-2209-ipc.log"
    report = explain_json(str(oom), str(ipc))
    assert [c["id"] for c in report["causes"]] == ["rccl-ipc", "out-of-memory"]
    assert {c["evidence"][0]["log"] for c in report["causes"]} == {str(oom), str(ipc)}
    assert [s["name"] for s in report["sources"]] == [str(oom), str(ipc)]
