"""`rocmdoctor upgrade` on one host: real installs from the loopback release server, real HTTP to a
protocol double of vLLM per bundle (harness/upgrade_lab.py, which also doubles `systemctl restart`),
the real smoke and bench. The gates' decisions: a good bundle moves, one that fails smoke or runs
slower is rolled back, check mode changes nothing, an interrupted run converges."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import jsonschema
import pytest

from harness.cli import rocmdoctor
from harness.engine import free_port
from harness.upgrade_lab import UpgradeLab, server_script
from rocmdoctor.report import load_schema

OLD = "vllm0.1.0-rocm7.0.0-gfx1151"
GOOD = "vllm0.2.0-rocm7.0.0-gfx1151"
BROKEN = "vllm0.3.0-rocm7.0.0-gfx1151"  # qualifies, then every completion fails (an ABI-broken engine)
SLOW = "vllm0.4.0-rocm7.0.0-gfx1151"  # streams three times slower
# Every token is paced, so the figures measure the bundle rather than the loaded test machine.
PACE = ("--token-delay", "0.01")
BUNDLES = {
    OLD: PACE,
    GOOD: PACE,
    BROKEN: ("--mode", "fail-completions"),
    SLOW: ("--token-delay", "0.03"),
}
# Where a good bundle must move whatever the shared test machine's load does to one measurement (the
# p95 of 8 requests swings with it); the gate's arithmetic is tests/unit/test_upgrade_plan.py's, and the
# slow bundle is rolled back at the default 10 %.
LOOSE = ("--max-regression", "400")
WORKLOAD = ("--concurrency", "1,4", "--requests", "8", "--prompt-tokens", "16", "--max-tokens", "16")


class Host:
    def __init__(self, install_lab, lab: UpgradeLab, units: dict[str, str]) -> None:
        self.install_lab, self.lab, self.units = install_lab, lab, units

    @property
    def prefix(self) -> Path:
        return self.install_lab.prefix

    def args(self, tag: str, *extra: str) -> list[str]:
        units = [f"--unit={name}={url}" for name, url in self.units.items()]
        return ["upgrade", "--tag", tag, "--prefix", str(self.prefix), *units, "--json", *extra]

    def upgrade(self, tag: str, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
        env = {"ROCMDOCTOR_GITHUB_API": self.install_lab.server.api_url, **self.lab.env()}
        proc = rocmdoctor(*self.args(tag, *extra), env=env)
        assert "Traceback" not in proc.stderr, proc.stderr
        return proc, json.loads(proc.stdout)

    def current(self) -> str:
        return os.readlink(self.prefix / "current").rsplit("/", 1)[-1]


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> bytes:
    """A `bench --record` baseline of OLD's double (its pacing, WORKLOAD), recorded once for the module:
    every test's instances run that double, so each starts from a copy (a bench is 2 s a unit)."""
    work = tmp_path_factory.mktemp("baseline")
    launcher = work / "prefix" / OLD / "bin" / "vllm-server"
    launcher.parent.mkdir(parents=True)
    launcher.write_bytes(server_script(*PACE))
    launcher.chmod(0o755)
    (work / "prefix" / "current").symlink_to(OLD)
    lab = UpgradeLab(work / "lab", work / "prefix")
    record = work / "bench-baseline.json"
    try:
        bench = rocmdoctor(
            "bench", "--url", lab.start("vllm@0", free_port()), *WORKLOAD, "--record", str(record)
        )
    finally:
        lab.stop_all()
    assert bench.returncode == 0, bench.stderr
    assert json.loads(record.read_text())["settings"]["requests"] == 8
    return record.read_bytes()


@pytest.fixture
def host(install_lab, tmp_path: Path, baseline: bytes):
    """OLD installed and serving on two instances, each with the module's baseline of OLD."""
    install_lab.pin("gfx1151", install_lab.bundle(OLD, {"bin/vllm-server": (server_script(*PACE), 0o755)}))
    assert install_lab.install("gfx1151").returncode == 0
    for tag, switches in BUNDLES.items():
        if tag != OLD:
            install_lab.bundle(tag, {"bin/vllm-server": (server_script(*switches), 0o755)})
    lab = UpgradeLab(tmp_path / "lab", install_lab.prefix)
    units = {name: lab.start(name, free_port()) for name in ("vllm@0", "vllm@1")}
    for name in units:
        (install_lab.prefix / f"bench-baseline.{name}.json").write_bytes(baseline)
    try:
        yield Host(install_lab, lab, units)
    finally:
        lab.stop_all()


def test_good_bundle_moves_one_instance_at_a_time_and_a_rerun_changes_nothing(host):
    proc, doc = host.upgrade(GOOD, *LOOSE)
    assert proc.returncode == 0, doc
    assert doc["outcome"] == "moved" and doc["changed"] is True and doc["failed"] is False
    jsonschema.Draft202012Validator(load_schema("change.schema.json")).validate(doc)
    assert (doc["origin"], doc["current"]) == (OLD, GOOD)
    assert doc["diff"] == {"before": {"current": OLD}, "after": {"current": GOOD}}
    assert host.current() == GOOD
    assert {unit: host.lab.running(unit) for unit in host.units} == {"vllm@0": GOOD, "vllm@1": GOOD}
    # one instance at a time: vllm@0 passed every gate before vllm@1 was drained
    order = [(s["step"], s["unit"]) for s in doc["steps"] if s["unit"]]
    assert order.index(("measure", "vllm@0")) < order.index(("drain", "vllm@1"))
    assert host.lab.restarts()[-2:] == ["restart vllm@0", "restart vllm@1"]
    for unit in host.units:
        figures = doc["figures"][unit]
        assert figures["measured"]["tokens_per_s"] > 0 and figures["measured"]["concurrency"] == 4
        assert isinstance(figures["throughput_change_pct"], float) and figures["baseline"]["tokens_per_s"] > 0

    restarts = host.lab.restarts()
    again_proc, again = host.upgrade(GOOD)
    assert again_proc.returncode == 0
    assert again["changed"] is False and again["outcome"] == "current"
    assert host.lab.restarts() == restarts


def test_requests_in_flight_end_before_the_restart_and_all_at_once_restarts_together(host):
    """Drain: a streamed answer of 800 paced tokens (about 8 s) in flight when the upgrade starts
    ends complete: the restart waited for vllm:num_requests_running to reach 0 (with
    `--drain-timeout 0` the restart cuts it)."""
    body = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 800, "stream": True}).encode()
    answer: dict[str, bytes] = {}

    def stream() -> None:
        request = urllib.request.Request(
            f"{host.units['vllm@0']}/v1/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer["body"] = response.read()

    client = threading.Thread(target=stream)
    client.start()
    deadline = time.monotonic() + 30
    while not host.lab.in_flight(host.units["vllm@0"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.is_alive() and host.lab.in_flight(host.units["vllm@0"]) == 1
    proc, doc = host.upgrade(GOOD, *LOOSE, "--all-at-once")
    client.join(timeout=60)
    assert proc.returncode == 0, doc
    assert answer["body"].rstrip().endswith(b"data: [DONE]")
    assert answer["body"].count(b'"text"') >= 800
    drained = next(s for s in doc["steps"] if s["step"] == "drain" and s["unit"] == "vllm@0")
    assert drained["detail"].startswith("no request running after ")
    order = [(s["step"], s["unit"]) for s in doc["steps"] if s["unit"]]
    assert order.index(("restart", "vllm@1")) < order.index(("ready", "vllm@0"))  # together


def test_a_named_load_balancer_stops_sending_before_the_drain_and_resumes_after_the_gates(host):
    balancer = host.lab.load_balancer(free_port())
    fixture_starts = host.lab.restarts()
    proc, doc = host.upgrade(GOOD, *LOOSE, "--load-balancer", balancer)
    assert proc.returncode == 0, doc
    hook = "/backends/this-host"
    # One unit at a time: out of the balancer, drained, restarted, gated, back in; then the next.
    assert host.lab.restarts()[len(fixture_starts) :] == [
        f"lb vllm@0 draining {hook}",
        "restart vllm@0",
        f"lb vllm@0 serving {hook}",
        f"lb vllm@1 draining {hook}",
        "restart vllm@1",
        f"lb vllm@1 serving {hook}",
    ]
    order = [(s["step"], s["unit"]) for s in doc["steps"] if s["unit"] == "vllm@0"]
    assert order.index(("balancer", "vllm@0")) < order.index(("drain", "vllm@0"))


def test_a_load_balancer_that_refuses_the_drain_stops_the_upgrade_before_any_restart(host):
    balancer = host.lab.load_balancer(free_port())
    (host.lab.lab / "lb.refuse").write_text("")
    restarts = host.lab.restarts()
    proc = rocmdoctor(
        *host.args(GOOD, *LOOSE, "--load-balancer", balancer),
        env={"ROCMDOCTOR_GITHUB_API": host.install_lab.server.api_url, **host.lab.env()},
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "did not take draining (it answered 503)" in proc.stderr, proc.stderr
    assert "run the upgrade again" in proc.stderr
    assert host.lab.restarts() == restarts and host.current() == OLD
    # Once the balancer takes it, the rerun goes on from there.
    (host.lab.lab / "lb.refuse").unlink()
    proc, doc = host.upgrade(GOOD, *LOOSE, "--load-balancer", balancer)
    assert proc.returncode == 0 and doc["outcome"] == "moved", doc
    assert host.current() == GOOD


def test_ready_only_gates_a_worker_on_readiness_alone(host):
    """A multi-node group's worker (--ready-only): no baseline, smoke or bench of its own, so a bundle
    whose completions fail moves it; the group's play judges the head and switches it back."""
    proc, doc = host.upgrade(BROKEN, "--ready-only")
    assert proc.returncode == 0, doc
    assert doc["outcome"] == "moved" and host.current() == BROKEN
    steps = {s["step"] for s in doc["steps"]}
    assert {"drain", "switch", "restart", "ready"} <= steps
    assert not steps & {"baseline", "smoke", "measure"} and doc["figures"] == {}


def test_bundle_that_fails_smoke_is_rolled_back(host):
    proc, doc = host.upgrade(BROKEN)
    assert proc.returncode == 1
    assert doc["outcome"] == "rolled-back" and doc["failed"] is True
    assert doc["reason"].startswith("vllm@0: smoke: ")
    assert host.current() == OLD
    # the canary instance is back on the old bundle; the other was never touched
    assert host.lab.running("vllm@0") == OLD and host.lab.running("vllm@1") == OLD
    assert host.lab.restarts()[-2:] == ["restart vllm@0", "restart vllm@0"]


def test_slower_bundle_is_rolled_back_on_the_regression_gate(host):
    proc, doc = host.upgrade(SLOW)
    assert proc.returncode == 1
    assert doc["reason"].startswith("vllm@0: regression: at concurrency 4: throughput ")
    assert "(allowed: 10 %)" in doc["reason"]
    figures = doc["figures"]["vllm@0"]
    assert figures["runs"] == 2  # confirmed by a second run before the rollback
    assert figures["throughput_change_pct"] < -10
    assert figures["measured"]["tokens_per_s"] < figures["baseline"]["tokens_per_s"]
    assert host.current() == OLD and host.lab.running("vllm@0") == OLD


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = path.read_bytes().hex()[:64] + str(path.stat().st_size)
        else:
            out[rel] = "dir"
    return out


def test_check_mode_shows_the_plan_and_changes_nothing(host):
    before = _tree(host.prefix)
    restarts = host.lab.restarts()
    proc, doc = host.upgrade(GOOD, "--check")
    assert proc.returncode == 0, doc
    assert doc["check"] is True and doc["changed"] is True and doc["outcome"] == "planned"
    jsonschema.Draft202012Validator(load_schema("change.schema.json")).validate(doc)  # the one envelope
    steps = [(s["step"], s["unit"]) for s in doc["steps"]]
    assert steps[0] == ("stage", None) and ("switch", None) in steps
    assert [s for s in steps if s[0] == "restart"] == [("restart", "vllm@0"), ("restart", "vllm@1")]
    assert _tree(host.prefix) == before
    assert host.lab.restarts() == restarts


def test_an_interrupted_upgrade_converges_on_the_next_run(host):
    env = {**os.environ, "ROCMDOCTOR_GITHUB_API": host.install_lab.server.api_url, **host.lab.env()}
    run = subprocess.Popen(
        [sys.executable, "-m", "rocmdoctor", *host.args(GOOD, *LOOSE)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    state = host.prefix / ".upgrade.json"
    deadline = time.monotonic() + 120
    step = None
    while time.monotonic() < deadline and run.poll() is None:
        if state.exists():
            step = json.loads(state.read_text())["step"]
            if step in ("ready", "smoke", "measure"):
                break
        time.sleep(0.02)
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=10)
    assert step in ("ready", "smoke", "measure"), step
    assert host.current() == GOOD  # killed after the switch: the host is mid-upgrade

    proc, doc = host.upgrade(GOOD, *LOOSE)
    assert proc.returncode == 0, doc
    assert doc["outcome"] == "moved" and host.current() == GOOD
    assert {unit: host.lab.running(unit) for unit in host.units} == {"vllm@0": GOOD, "vllm@1": GOOD}
    assert json.loads(state.read_text())["step"] == "done"


def test_a_damaged_state_or_baseline_is_refused_with_what_to_do(host):
    baseline = host.prefix / "bench-baseline.vllm@0.json"
    baseline.write_text('{"settings": "x"}')
    proc = rocmdoctor(
        *host.args(GOOD), env={"ROCMDOCTOR_GITHUB_API": host.install_lab.server.api_url, **host.lab.env()}
    )
    assert proc.returncode == 1 and json.loads(proc.stdout)["failed"] is True
    assert "not a usable baseline" in proc.stderr and "rocmdoctor bench --json" in proc.stderr
    assert host.current() == OLD and host.lab.restarts() == ["restart vllm@0", "restart vllm@1"]
    (host.prefix / ".upgrade.json").write_bytes(b"\x00garbage")
    proc = rocmdoctor(
        *host.args(GOOD), env={"ROCMDOCTOR_GITHUB_API": host.install_lab.server.api_url, **host.lab.env()}
    )
    assert proc.returncode == 1 and "is not an upgrade's state" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and host.current() == OLD


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--unit", "vllm 0=http://127.0.0.1:1"), "give UNIT=URL"),
        (("--unit", "vllm@0"), "give UNIT=URL"),
        (("--unit", "vllm=ftp://x"), "--url"),
        (("--max-regression", "-5"), "--max-regression"),
        (("--load-balancer", "lb.example:9000"), "--load-balancer 'lb.example:9000': give the http(s) URL"),
    ],
)
def test_bad_input_is_refused_with_what_to_do(tmp_path: Path, args: tuple[str, ...], message: str):
    proc = rocmdoctor("upgrade", "--tag", GOOD, "--prefix", str(tmp_path / "p"), *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_the_baseline_recorded_at_install_is_the_workload_upgrade_measures():
    """site.yml's smoke phase records the baseline (rocmdoctor_record_baseline) with the workload
    upgrade measures on a host without one, where upgrade looks for it."""
    import yaml

    from rocmdoctor.provision.bundle.upgrade_plan import DEFAULT_WORKLOAD

    role = Path(__file__).resolve().parents[2] / "playbooks/roles/rocmdoctor"
    tasks = yaml.safe_load((role / "tasks/smoke.yml").read_text())
    task = next(t for t in tasks if "rocmdoctor_record_baseline" in t["name"])
    argv = task["ansible.builtin.command"]["argv"]
    for option, key in (("concurrency", "concurrency"), ("requests", "requests"),
                        ("prompt-tokens", "prompt_tokens"), ("max-tokens", "max_tokens")):  # fmt: skip
        value = DEFAULT_WORKLOAD[key]
        wanted = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        assert f"'--{option}', '{wanted}'" in argv, (option, argv)
    variables = yaml.safe_load((role / "vars/main.yml").read_text())
    assert variables["_rocmdoctor_baseline_file"].endswith(
        "/bench-baseline.{{ rocmdoctor_service_name }}.json"
    )  # upgrade's baseline_path(prefix, unit)
