"""`rocmdoctor upgrade`: move one host's server to a new bundle with no outage and no regression, or
leave it on the bundle it came from.

Every change goes through the HostWriter (check mode records the plan and makes nothing): the staged
install (`install.install` with `activate=False`), the state file written before each step, `current`
switched and switched back (`install.rollback`), and the units restarted (`systemctl restart`, which
returns once the unit's ExecStartPost readiness wait passed). The server is asked over HTTP through
`bounded_http` (/metrics while draining, /health for readiness) and by smoke and bench themselves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from rocmdoctor import documents
from rocmdoctor.host_writes import HostWriter, WriteRefused
from rocmdoctor.model import Change, state_diff
from rocmdoctor.provision import bounded_http
from rocmdoctor.provision.bundle import upgrade_plan as up
from rocmdoctor.provision.bundle.install import InstallError, InstallPlan, Layout, install, rollback
from rocmdoctor.provision.verify import prometheus

RUNNING = "vllm:num_requests_running"  # vLLM's gauge of requests in the engine now
POLL_S = 0.5
METRICS_LIMIT = 4 << 20
RESTART_TIMEOUT_S = 900.0
MEASUREMENTS = 2  # a regression is confirmed by a second run before the host is rolled back
# The load balancer's hook (--load-balancer URL): POST {"unit": NAME, "state": DRAINING} before a unit
# is drained, {"state": SERVING} once it serves again (moved, or rolled back); any 2xx is taken.
DRAINING, SERVING = "draining", "serving"
BALANCER_TIMEOUT_S = 30.0


class UpgradeError(InstallError):
    """The upgrade cannot start or go on (an interrupted upgrade to another bundle, a bad baseline)."""


@dataclass(frozen=True)
class UpgradeOptions:
    units: tuple[up.Unit, ...]
    baseline_dir: Path
    model: str = "auto"
    api_key: str | None = None
    all_at_once: bool = False
    max_regression_pct: float = up.DEFAULT_MAX_REGRESSION_PCT
    drain_timeout_s: float = 60.0
    ready_timeout_s: float = 600.0
    smoke_timeout_s: float = 120.0
    bench_timeout_s: float = 120.0
    load_balancer: str | None = None
    # A multi-node group's worker: its units are gated on readiness only (the group's server, on the
    # head, is smoked and measured by the head's own upgrade).
    ready_only: bool = False


@dataclass
class UpgradeResult:
    changed: bool
    msg: str
    target: str
    origin: str | None
    current: str | None
    outcome: str  # moved, rolled-back, current (nothing to do), planned (check mode)
    reason: str | None = None
    steps: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    check: bool = False

    @property
    def failed(self) -> bool:
        return self.outcome == up.ROLLED_BACK

    def change(self) -> Change:
        data = {
            "target": self.target,
            "origin": self.origin,
            "current": self.current,
            "outcome": self.outcome,
            "reason": self.reason,
            "steps": self.steps,
            "figures": self.figures,
            "check": self.check,
            "failed": self.failed,
        }
        return Change(
            self.changed, self.msg, state_diff({"current": self.origin}, {"current": self.current}), data
        )


class _GateFailed(Exception):
    def __init__(self, unit: str, gate: str, reason: str) -> None:
        super().__init__(f"{unit}: {gate}: {reason}")


@dataclass
class _Run:
    """One run of the upgrade: the prefix, the writer, what it did so far."""

    layout: Layout
    writer: HostWriter
    options: UpgradeOptions
    state: up.UpgradeState
    steps: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def state_path(self) -> str:
        return str(self.layout.prefix / up.STATE_FILE)

    def record(self, step: str, **fields: Any) -> None:
        """The state before `step`, atomically: a run killed now resumes or rolls back from here."""
        for key, value in fields.items():
            setattr(self.state, key, value)
        self.state.step = step
        self.writer.write_file(self.state_path, msgspec.json.encode(self.state) + b"\n", 0o644)

    def note(self, step: str, unit: str | None, detail: str, **extra: Any) -> None:
        self.steps.append({"step": step, "unit": unit, "detail": detail, **extra})

    # -- the steps ---------------------------------------------------------------------------------

    def baseline(self, unit: up.Unit) -> dict[str, Any]:
        """The unit's recorded bench report; measured on the running (old) bundle and recorded when
        there is none."""
        path = baseline_path(self.options.baseline_dir, unit.name)
        raw = self.writer.read_current(str(path), up.STATE_LIMIT * 16)
        if raw is not None:
            try:
                report = documents.load_object(raw, str(path), up.STATE_LIMIT * 16)
                up.workload(report), up.figures(report)
            except (documents.DocumentError, up.BaselineError) as exc:
                raise UpgradeError(
                    f"{path}: not a usable baseline ({exc}); record one with `rocmdoctor bench "
                    f"--json > {path}` against {unit.url}, or remove it to have upgrade measure one"
                ) from None
            self.note("baseline", unit.name, f"recorded in {path}")
            return report
        if self.writer.check_mode:
            self.note("baseline", unit.name, f"would measure {unit.url} and record it in {path}")
            return {}
        report = measure(self.options, unit, dict(up.DEFAULT_WORKLOAD))
        if report.get("failures") or report.get("aborted"):
            raise UpgradeError(
                f"the baseline of {unit.name} could not be measured on {self.state.origin} "
                f"({report.get('aborted') or report.get('failures')}); nothing was changed"
            )
        self.writer.write_file(str(path), documents_json(report), 0o644)
        self.note("baseline", unit.name, f"measured on {self.state.origin} and recorded in {path}")
        return report

    def balance(self, unit: up.Unit, state: str) -> None:
        """Tell the load balancer to stop (DRAINING) or go on (SERVING) sending new requests to the
        unit. A balancer that does not take DRAINING stops the run before the unit is touched (a
        restart now would cut the requests it still sends): the rerun resumes from here."""
        url = self.options.load_balancer
        if url is None:
            return
        if not self.writer.change("load-balancer", f"{unit.name} {state}"):
            self.note("balancer", unit.name, f"would tell {url} {state}")
            return
        why = tell_balancer(url, unit.name, state)
        if why is not None and state == DRAINING:
            raise UpgradeError(
                f"{unit.name}: the load balancer {url} did not take {state} ({why}); {unit.name} was "
                "left serving as it was: fix the balancer, then run the upgrade again to go on"
            )
        self.note("balancer", unit.name, f"{url} took {state}" if why is None else f"{url}: {why}")

    def drain(self, unit: up.Unit) -> None:
        """Wait (bounded) for the requests in the engine to end, read from vLLM's own gauge."""
        if not self.writer.change("drain", unit.name):
            self.note(
                "drain", unit.name, f"would wait up to {self.options.drain_timeout_s:g} s for {RUNNING} 0"
            )
            return
        started = time.monotonic()
        running: float | None = None
        while True:
            running = in_flight(unit.url)
            waited = time.monotonic() - started
            if running is None or running <= 0 or waited >= self.options.drain_timeout_s:
                break
            time.sleep(POLL_S)
        if running is None:
            detail = f"{unit.url}/metrics has no {RUNNING}: not drained"
        elif running > 0:
            detail = f"{running:g} request(s) still running after {self.options.drain_timeout_s:g} s"
        else:
            detail = f"no request running after {waited:.1f} s"
        self.note("drain", unit.name, detail)

    def switch(self, to: str) -> None:
        if self.writer.check_mode:  # the staged bundle is not there yet for rollback's own dry run
            self.writer.change("activate", f"{self.layout.current} -> bundles/{to}")
            self.note("switch", None, f"would switch from {self.layout.current_tag()} to {to}")
            return
        result = rollback(self.layout.prefix, self.writer, to, force=False)
        self.note("switch", None, result.msg)

    def restart(self, unit: up.Unit) -> None:
        argv = ["systemctl", "restart", unit.name]
        try:
            self.writer.run(argv, RESTART_TIMEOUT_S)
        except WriteRefused as exc:
            raise _GateFailed(unit.name, "restart", str(exc)) from None
        self.note("restart", unit.name, ("would run " if self.writer.check_mode else "ran ") + " ".join(argv))

    def ready(self, unit: up.Unit) -> None:
        if self.writer.check_mode:
            self.note("ready", unit.name, f"would wait up to {self.options.ready_timeout_s:g} s for /health")
            return
        started = time.monotonic()
        why = wait_healthy(unit.url, self.options.ready_timeout_s)
        if why:
            raise _GateFailed(unit.name, "ready", why)
        self.note("ready", unit.name, f"/health answered 200 after {time.monotonic() - started:.1f} s")

    def smoke_gate(self, unit: up.Unit) -> None:
        if self.writer.check_mode:
            self.note("smoke", unit.name, "would run smoke")
            return
        from rocmdoctor.provision.verify.smoke import SmokeOptions, run_smoke

        options = self.options
        report = run_smoke(SmokeOptions(unit.url, options.model, options.api_key, options.smoke_timeout_s))
        failed = [s for s in report.get("steps", []) if s.get("status") in ("fail", "error")]
        if failed:
            first = failed[0]
            raise _GateFailed(unit.name, "smoke", f"step {first.get('id')}: {first.get('summary')}")
        self.note("smoke", unit.name, f"{len(report.get('steps', []))} steps, none failed")

    def measure(self, unit: up.Unit, baseline: dict[str, Any]) -> None:
        """The baseline's workload on the new bundle; a regression must show twice (one run of a small
        workload swings with whatever else the host does): the figures are the last run's."""
        if self.writer.check_mode or not baseline:
            self.note("measure", unit.name, "would run the baseline's bench workload and compare")
            return
        before = up.figures(baseline)
        for runs in range(1, MEASUREMENTS + 1):
            after = self._measured(unit, baseline)
            why = up.regression(before, after, self.options.max_regression_pct)
            self.figures[unit.name] = {**up.comparison(before, after), "runs": runs}
            if why is None:
                break
        if why:
            raise _GateFailed(unit.name, "regression", why)
        self.note("measure", unit.name, "within the threshold", **self.figures[unit.name])

    def _measured(self, unit: up.Unit, baseline: dict[str, Any]) -> up.Figures:
        report = measure(self.options, unit, up.workload(baseline))
        if report.get("failures") or report.get("aborted"):
            raise _GateFailed(
                unit.name, "measure", f"bench failed: {report.get('aborted') or report.get('failures')}"
            )
        try:
            return up.figures(report)
        except up.BaselineError as exc:
            raise _GateFailed(unit.name, "measure", f"the new bundle's bench report: {exc}") from None


def measure(options: UpgradeOptions, unit: up.Unit, workload: dict[str, Any]) -> dict[str, Any]:
    """bench's report of `workload` on the unit; an aborted run is a report with `aborted` set."""
    from rocmdoctor.provision.verify.bench import BenchAborted, BenchOptions, run_bench

    try:
        return run_bench(
            BenchOptions(
                unit.url,
                options.model,
                options.api_key,
                options.bench_timeout_s,
                tuple(workload["concurrency"]),
                workload["requests"],
                workload["prompt_tokens"],
                workload["max_tokens"],
            )
        )
    except BenchAborted as exc:
        return {"aborted": str(exc), "failures": None}


def baseline_path(directory: Path, unit: str) -> Path:
    return directory / f"bench-baseline.{unit}.json"


def documents_json(document: Any) -> bytes:
    from rocmdoctor.report import dumps

    return dumps(document).encode()


def in_flight(url: str) -> float | None:
    """The requests vLLM is running now (its gauge, summed over engines); None when it cannot tell."""
    try:
        answer = bounded_http.get(
            f"{url}/metrics", deadline=bounded_http.Deadline(10.0), limit=METRICS_LIMIT, read_s=10.0
        )
        if answer.status != 200 or len(answer.body) > METRICS_LIMIT:
            return None
        samples = prometheus.parse(answer.body.decode("utf-8", "replace"))
    except (bounded_http.HttpError, prometheus.MetricsFormatError):
        return None
    return prometheus.counter_sum(samples, RUNNING)


def tell_balancer(url: str, unit: str, state: str) -> str | None:
    """None once the load balancer answered 2xx to the unit's new state; else what went wrong."""
    try:
        answer = bounded_http.request(
            "POST",
            url,
            deadline=bounded_http.Deadline(BALANCER_TIMEOUT_S),
            limit=4096,
            json_body={"unit": unit, "state": state},
            read_s=BALANCER_TIMEOUT_S,
        )
    except bounded_http.HttpError as exc:
        return str(exc)
    return None if 200 <= answer.status < 300 else f"it answered {answer.status}"


def wait_healthy(url: str, timeout_s: float) -> str | None:
    """None once /health answers 200 within `timeout_s`; else what it answered last."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            answer = bounded_http.get(
                f"{url}/health", deadline=bounded_http.Deadline(min(10.0, timeout_s)), limit=4096, read_s=10.0
            )
            if answer.status == 200:
                return None
            last = f"/health answered {answer.status}"
        except bounded_http.HttpError as exc:
            last = str(exc)
        time.sleep(POLL_S)
    return f"not ready within {timeout_s:g} s ({last})"


def read_state(writer: HostWriter, layout: Layout) -> up.UpgradeState | None:
    where = str(layout.prefix / up.STATE_FILE)
    raw = writer.read_current(where, up.STATE_LIMIT)
    if raw is None:
        return None
    try:
        return documents.decode(raw, up.UpgradeState, where, up.STATE_LIMIT)
    except documents.DocumentError as exc:
        raise UpgradeError(
            f"{where} is not an upgrade's state ({exc}); check `current` with `rocmdoctor bundles`, "
            "then remove the file and run again"
        ) from None


def upgrade(
    plan: InstallPlan,
    options: UpgradeOptions,
    writer: HostWriter,
) -> UpgradeResult:
    """Upgrade this host's units to `plan.tag` (staged with `plan`, never activated by it)."""
    plan.activate = False
    layout = Layout(plan.prefix)
    target, current = plan.tag, layout.current_tag()
    state = read_state(writer, layout)
    if state is not None and state.step != up.DONE and state.target != target:
        raise UpgradeError(
            f"an upgrade to {state.target} was interrupted at its {state.step} step: run "
            f"`rocmdoctor upgrade --tag {state.target}` again to finish it (or roll it back) first"
        )
    point = up.resume_point(state, current, target)
    if point == "current":
        return UpgradeResult(False, f"{target} is already current", target, current, current, "current")
    origin = state.origin if state is not None and point in ("resume", "rollback") else current
    run = _Run(
        layout,
        writer,
        options,
        up.UpgradeState(target, origin, "stage") if point == "start" else state,  # type: ignore[arg-type]
    )
    try:
        if point == "rollback":
            return _roll_back(run, run.state.reason or "an interrupted rollback")
        if point == "start":
            if origin is None:
                raise UpgradeError(
                    f"nothing is current under {layout.prefix}: install a bundle first (`rocmdoctor install`)"
                )
            run.record("stage", units_done=[], batch=[], outcome=None, reason=None)
            staged = install(plan, writer)
            run.note("stage", None, staged.msg)
        run.record("baseline")
        baselines = {unit.name: {} if options.ready_only else run.baseline(unit) for unit in options.units}
        switched = layout.current_tag() == target and not writer.check_mode
        for batch in up.batches(options.units, options.all_at_once):
            names = [unit.name for unit in batch]
            if set(names) <= set(run.state.units_done):
                continue
            run.record("drain", batch=names)
            for unit in batch:
                run.balance(unit, DRAINING)
                run.drain(unit)
            if not switched:
                run.record("switch")
                run.switch(target)
                switched = True
            run.record("restart")
            for unit in batch:
                run.restart(unit)
            run.record("ready")
            for unit in batch:
                run.ready(unit)
            if not options.ready_only:
                run.record("smoke")
                for unit in batch:
                    run.smoke_gate(unit)
                run.record("measure")
                for unit in batch:
                    run.measure(unit, baselines[unit.name])
            for unit in batch:
                run.balance(unit, SERVING)
            run.state.units_done = [*run.state.units_done, *names]
    except _GateFailed as exc:
        return _roll_back(run, str(exc))
    run.record(up.DONE, outcome=up.MOVED, batch=[])
    verb = "would move" if writer.check_mode else "moved"
    return UpgradeResult(
        True,
        f"{verb} from {origin} to {target}",
        target,
        origin,
        target if not writer.check_mode else current,
        "planned" if writer.check_mode else up.MOVED,
        steps=run.steps,
        figures=run.figures,
        check=writer.check_mode,
    )


def _roll_back(run: _Run, reason: str) -> UpgradeResult:
    """Back to the bundle the upgrade came from; the units already on the new one restarted on it."""
    origin = run.state.origin
    run.record(up.ROLLBACK, reason=reason)
    if origin is not None and run.layout.current_tag() != origin:
        run.switch(origin)
    moved = [u for u in run.options.units if u.name in {*run.state.units_done, *run.state.batch}]
    for unit in moved:
        try:
            run.writer.run(["systemctl", "restart", unit.name], RESTART_TIMEOUT_S)
            why = wait_healthy(unit.url, run.options.ready_timeout_s)
        except WriteRefused as exc:
            why = f"its restart failed ({exc}): restart it by hand"
        run.note("rollback", unit.name, f"restarted on {origin}" + (f"; {why}" if why else ""))
        if not why:
            run.balance(unit, SERVING)
    run.record(up.DONE, outcome=up.ROLLED_BACK, units_done=[], batch=[])
    return UpgradeResult(
        True,
        f"rolled back to {origin}: {reason}",
        run.state.target,
        origin,
        run.layout.current_tag(),
        up.ROLLED_BACK,
        reason,
        run.steps,
        run.figures,
    )
