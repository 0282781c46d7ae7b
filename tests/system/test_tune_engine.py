"""`rocmdoctor tune` on the real vLLM CPU engine (the installed test bundle, the tiny model, eager mode).

One tune run measures two settings and writes the winner as a drop-in of a unit written by `unit
--write` into a tree; the runs after it reuse its state file (no server): a rerun that measures nothing,
a limit nothing meets (exit 1, the best seen), and the kills in the phases that need no server.

Then tune is killed (SIGTERM and SIGKILL of the tune process itself, never its group) in every phase:
plan, server starting, warm-up, measuring, writing back. After each, no process carrying the run's tag
(which every server process and the tether inherit from tune's environment) is left, and the unit tree
and the state file are byte-identical. A SIGKILLed tune runs no `finally`: its server dies by the
tether (host_processes.ProcessGroup), which is what these kills prove. Server starts: 2 for the
measured run, one per kill in the warm-up and measuring phases, and the "starting" kills stop a loading
one (3 minutes in all on the shared 2-core VM, the test bundle's install included).
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import jsonschema
import psutil
import pytest

from harness.cli import rocmdoctor
from harness.engine import free_port
from harness.served_bundle import ENGINE_ARGS, ENGINE_ENV
from harness.trees import account_root, tree_state
from rocmdoctor.report import load_schema

HARNESS = Path(__file__).resolve().parents[1] / "harness"

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

TAG = "ROCMDOCTOR_TEST_TUNE_TAG"
CHANGE = jsonschema.Draft202012Validator(load_schema("change.schema.json"))
DROPIN = "etc/systemd/system/vllm.service.d/rocmdoctor-tune.conf"


def tagged(tag: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(TAG) == tag:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def wait_none_tagged(tag: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while (left := tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], f"processes of the tune run left behind: {[psutil.Process(p).cmdline() for p in left]}"


class Setup:
    def __init__(self, prefix: Path, model: Path, base: Path) -> None:
        self.prefix, self.model, self.base = prefix, model, base
        self.pristine = account_root(base / "pristine")  # a unit written by `unit --write`, no drop-in
        done = rocmdoctor(
            "unit", "--write", "--target", str(self.pristine), "--prefix", str(prefix), "--model", str(model),
            "--served-model-name", "tiny", "--gpu-memory-utilization", "0.5", "--max-model-len", "512",
            "--", *ENGINE_ARGS,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        self.state = base / "state.json"

    def copy_target(self, name: str) -> Path:
        target = self.base / name
        shutil.copytree(self.pristine, target, symlinks=True)
        return target

    def argv(self, target: Path, state: Path, *extra: str) -> list[str]:
        return [
            sys.executable, "-m", "rocmdoctor", "tune", "--json", "--prefix", str(self.prefix),
            "--model", str(self.model), "--served-model-name", "tiny", "--port", str(free_port()),
            "--gpu-memory-utilization", "0.5", "--max-model-len", "512", "--kv-cache-memory", "1GiB",
            "--requests", "4", "--min-seconds", "0", "--prompt-tokens", "16", "--output-tokens", "8", "--start-timeout", "400",
            "--write", "--target", str(target), "--state-file", str(state),
            "--log-dir", str(self.base / "logs"), *extra, "--", *ENGINE_ARGS,
        ]  # fmt: skip


class TuneRun:
    """tune as a child process with its own tag; its JSON events read from stderr line by line."""

    def __init__(self, argv: list[str], hold: str | None = None) -> None:
        self.tag = uuid.uuid4().hex
        env = {**os.environ, **ENGINE_ENV, TAG: self.tag}
        if hold:  # the same command, held once it announced that phase
            argv = [argv[0], str(HARNESS / "tune_held.py"), hold, *argv[3:]]
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
        )
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.process.stderr, selectors.EVENT_READ)
        self.lines: list[str] = []
        self.pending = ""  # read from stderr, not yet a whole line

    def wait_event(self, name: str, timeout: float) -> dict:
        """The next event called `name`. stderr is read from its descriptor (a text reader's buffer would
        hide a second line that arrived with the first from the selector)."""
        deadline = time.monotonic() + timeout
        while True:
            while "\n" in self.pending:
                line, self.pending = self.pending.split("\n", 1)
                self.lines.append(line + "\n")
                if line.startswith("{") and json.loads(line)["event"] == name:
                    return json.loads(line)
            if time.monotonic() >= deadline:
                break
            if self.selector.select(timeout=1.0):
                chunk = os.read(self.process.stderr.fileno(), 65536)
                if not chunk:
                    break
                self.pending += chunk.decode(errors="replace")
        raise AssertionError(f"no {name!r} event within {timeout} s:\n{''.join(self.lines)}{self.pending}")

    def finish(self, timeout: float = 600) -> tuple[int, dict]:
        out, err = self.process.communicate(timeout=timeout)
        self.lines.append(self.pending + err)
        self.pending = ""
        return self.process.returncode, (json.loads(out) if out.strip() else {})

    def __enter__(self) -> TuneRun:
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def setup(installed_prefix, tiny_model, tmp_path_factory) -> Setup:
    return Setup(installed_prefix, tiny_model, tmp_path_factory.mktemp("tune"))


@pytest.fixture(scope="module")
def tuned(setup):
    """One measured run: max-num-seqs 1 and 2, the winner written into a copy of the unit tree."""
    target = setup.copy_target("tuned")
    plot = setup.base / "tune.png"
    with TuneRun(setup.argv(target, setup.state, "--seqs", "1,2", "--plot", str(plot))) as run:
        code, document = run.finish()
        wait_none_tagged(run.tag)
    return code, document, target, plot, "".join(run.lines)


def test_tune_measures_each_setting_on_its_own_server_and_writes_the_winner(setup, tuned):
    code, document, target, plot, stderr = tuned
    assert code == 0, stderr
    CHANGE.validate(document)
    assert document["changed"] is True and document["check"] is False and "+ExecStart=" in document["diff"]
    assert document["server_starts"] == 2 and document["known_points_used"] == 0
    points = {p["max_num_seqs"]: p for p in document["points"]}
    assert sorted(points) == [1, 2]
    for seqs, point in points.items():
        assert point["error"] == "" and point["failures"] == 0 and point["requests"] == max(4, 4 * seqs)
        assert point["output_tokens_per_s"] > 0 and point["start_seconds"] > 0
        assert point["latency_ms"]["ttft"]["p95"] > 0 and point["latency_ms"]["e2el"]["p95"] > 0
    winner = document["winner"]["max_num_seqs"]
    dropin = (target / DROPIN).read_text()
    assert f"--max-num-seqs {winner}" in dropin and dropin.count("--max-num-seqs") == 1
    # The rest of the command line is the unit's own, as `unit --write` wrote it.
    unit = (target / "etc/systemd/system/vllm.service").read_text()
    assert "--enforce-eager" in dropin and "--load-format dummy" in dropin and "--enforce-eager" in unit
    logs = {p.name for p in (setup.base / "logs").glob("tune-*.log")}
    assert {"tune-1-seqs1.log", "tune-2-seqs2.log"} <= logs  # one server log per setting
    assert plot.read_bytes().startswith(b"\x89PNG")
    state = json.loads(setup.state.read_text())
    (entry,) = state["entries"].values()
    assert sorted(p["max_num_seqs"] for p in entry["points"]) == [1, 2]


def test_a_rerun_knows_every_point_starts_nothing_and_converges(setup, tuned):
    _, first, target, _, _ = tuned
    before = tree_state(target)
    with TuneRun(setup.argv(target, setup.state, "--seqs", "1,2")) as run:
        code, document = run.finish(timeout=120)
    assert code == 0
    assert document["server_starts"] == 0 and document["known_points_used"] == 2
    assert document["winner"]["max_num_seqs"] == first["winner"]["max_num_seqs"]
    assert document["changed"] is False and document["diff"] == ""
    assert tree_state(target) == before


def test_a_limit_nothing_meets_is_exit_1_with_the_best_setting_seen(setup, tuned):
    _, first, target, _, _ = tuned
    before = tree_state(target)
    with TuneRun(setup.argv(target, setup.state, "--seqs", "1,2", "--slo", "ttft:p50<=0.001ms")) as run:
        code, document = run.finish(timeout=120)
    assert code == 1
    assert document["winner"] is None and document["changed"] is False
    # The smallest setting already broke it: nothing larger is tried, and it is the best seen.
    assert [p["max_num_seqs"] for p in document["points"]] == [1]
    assert document["best_seen"]["max_num_seqs"] == 1 and document["best_seen"]["source"] == "state"
    assert "no setting met ttft p50 <= 0.001 ms" in document["reason"]
    assert document["server_starts"] == 0
    assert tree_state(target) == before


def test_check_confirms_the_winner_under_a_limit_and_leaves_nothing_behind(
    setup, tuned, tmp_path, monkeypatch
):
    """Issue 35: under --slo the winner is measured again (--confirm 1: one server start, the two search
    points known), and `tune --check` writes nothing of its own: no state, no JIT cache fingerprint, no
    drop-in, its server logs in a private directory that is gone when it ends."""
    _, first, target, _, _ = tuned
    before, state_bytes = tree_state(target), setup.state.read_bytes()
    cache = tmp_path / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    argv = setup.argv(target, setup.state, "--seqs", "1,2", "--slo", "e2el:p95<=300s", "--confirm", "1")
    at = argv.index("--log-dir")
    argv = [("--check" if word == "--write" else word) for word in argv[:at] + argv[at + 2 :]]
    with TuneRun(argv) as run:
        starting = run.wait_event("starting", timeout=300)
        code, document = run.finish()
        wait_none_tagged(run.tag)
    assert code == 0, "".join(run.lines)
    CHANGE.validate(document)
    assert document["check"] is True and document["known_points_used"] == 2 and document["server_starts"] == 1
    confirmation = document["confirmation"]
    assert confirmation["times"] == 1 and confirmation["margin"] == 0.1 and confirmation["rejected"] == []
    (again,) = confirmation["runs"]
    # Under a limit both known points meet, the winner is the most output tokens/s of them (not the
    # first run's knee, which may be the smaller setting when the two are close on a loaded machine).
    fastest = max(first["points"], key=lambda p: (p["output_tokens_per_s"], -p["max_num_seqs"]))
    assert again["max_num_seqs"] == document["winner"]["max_num_seqs"] == fastest["max_num_seqs"]
    assert again["error"] == "" and again["output_tokens_per_s"] > 0 and again["source"] == "measured"
    assert "confirmed by 1 more measurement(s)" in document["reason"]
    assert tree_state(target) == before and setup.state.read_bytes() == state_bytes
    assert not (cache / "rocmdoctor").exists()  # no JIT cache, fingerprint, state or log of tune's
    log = Path(starting["log"])
    assert log.parent.name.startswith("rocmdoctor-tune-check-") and not log.parent.exists()


KILLS = [
    ("plan", signal.SIGTERM),
    ("plan", signal.SIGKILL),
    ("writing", signal.SIGTERM),
    ("writing", signal.SIGKILL),
    ("starting", signal.SIGTERM),
    ("starting", signal.SIGKILL),
    # With a ready server each signal once (pairwise): the two phases hold the same server and client,
    # and each of these costs a full engine start (the suite's largest single cost).
    ("warm-up", signal.SIGTERM),
    ("measuring", signal.SIGKILL),
]


@pytest.mark.parametrize(("phase", "sig"), KILLS, ids=[f"{p}-{s.name}" for p, s in KILLS])
def test_a_killed_tune_leaves_no_server_and_the_configuration_as_it_was(setup, tuned, phase, sig, tmp_path):
    target = setup.copy_target(f"kill-{phase}-{sig.name}")
    # Writing back: every point known (no server), so tune goes straight to the write it is killed in.
    # The other phases: an empty state, so a server is started.
    state = tmp_path / "state.json"
    if phase in ("plan", "writing"):
        shutil.copy(setup.state, state)
    before, state_before = tree_state(target), state.read_bytes() if state.exists() else None
    with TuneRun(
        setup.argv(target, state, "--seqs", "1,2" if phase == "writing" else "1"), hold=phase
    ) as run:
        event = run.wait_event(phase, timeout=400)
        assert run.wait_event("held", timeout=60)["phase"] == phase
        if phase == "starting":
            assert run.process.poll() is None and tagged(run.tag)  # the server is loading
            assert "log" in event
        os.kill(run.process.pid, sig)
        code, _ = run.finish(timeout=120)
        assert code == (1 if sig == signal.SIGTERM else -signal.SIGKILL), "".join(run.lines)
        if sig == signal.SIGTERM and phase not in ("plan",):
            assert "no server process left" in run.lines[-1]
        wait_none_tagged(run.tag)
    assert tree_state(target) == before
    assert not (target / DROPIN).exists()
    assert (state.read_bytes() if state.exists() else None) == state_before
