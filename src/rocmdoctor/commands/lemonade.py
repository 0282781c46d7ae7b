"""`rocmdoctor lemonade`: Lemonade Server as the target: diagnose its vLLM models, apply the options
rocmdoctor computes through Lemonade's options API, verify through its OpenAI endpoint.

The one place the diagnosis (host checks, the GPU's free memory) meets Lemonade (provision.lemonade).
The admin key comes from --admin-key-file or LEMONADE_ADMIN_API_KEY / LEMONADE_API_KEY (Lemonade's own
clients prefer the admin key the same way) and never appears in any output.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from rocmdoctor import params
from rocmdoctor.commands.common import App, UserError, emit_change, emit_json, pass_app
from rocmdoctor.commands.lemonade_targets import admin_key, lemonade_url

if TYPE_CHECKING:
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.model import Change, Row
    from rocmdoctor.provision.server.lemonade_api import Lemonade


@dataclass(frozen=True)
class Target:
    """The options every subcommand takes: which Lemonade, with which key, which models."""

    url: str | None
    admin_key_file: Path | None
    models: tuple[str, ...]
    timeout_s: float
    as_json: bool


def _options(command: Any) -> Any:
    """The shared options, handed to the command as one `Target` after the App."""

    @functools.wraps(command)
    def with_target(app: App, url, admin_key_file, models, timeout_s, as_json, **rest: Any) -> Any:
        return command(app, Target(url, admin_key_file, models, timeout_s, as_json), **rest)

    fn: Any = with_target
    fn = click.option("--json", "as_json", is_flag=True, help="Print the versioned JSON document on stdout.")(
        fn
    )
    fn = click.option(
        "--timeout",
        "timeout_s",
        type=params.Duration(max_s=3600),
        default=30.0,
        show_default=True,
        help="Seconds one request to Lemonade may take (a load takes Lemonade's global_timeout).",
    )(fn)
    fn = click.option(
        "--model",
        "models",
        multiple=True,
        metavar="ID",
        help="A Lemonade model id (e.g. user.Qwen3-4B-vLLM); default: every model with the vllm recipe.",
    )(fn)
    fn = click.option(
        "--admin-key-file",
        type=params.NonEmptyPath(path_type=Path, dir_okay=False),
        callback=params.key_file(),
        default=None,
        help="File holding LEMONADE_ADMIN_API_KEY (default: that variable, then LEMONADE_API_KEY).",
    )(fn)
    fn = click.option(
        "--url",
        type=params.ServerUrl(),
        default=None,
        envvar="ROCMDOCTOR_LEMONADE_URL",
        help="Lemonade Server (default: the port in /var/lib/lemonade/config.json, else 13305 on loopback).",
    )(fn)
    return fn


def _client(app: App, target: Target) -> Any:
    from rocmdoctor.provision.server.lemonade_api import Lemonade

    return Lemonade(lemonade_url(app, target.url), admin_key(target.admin_key_file), target.timeout_s)


def _fail(exc: Exception, as_json: bool) -> NoReturn:
    """A Lemonade that cannot be used: a clear finding and exit 2."""
    kind = getattr(exc, "kind", "error")
    if as_json:
        from rocmdoctor.model import envelope

        emit_json(envelope(ok=False, error={"kind": kind, "message": str(exc)}))
        sys.exit(2)
    raise UserError(str(exc))


@click.group()
def lemonade() -> None:
    """Lemonade Server as the target: check, apply the computed vLLM options, verify.

    \b
    rocmdoctor lemonade check            what is wrong with Lemonade's vLLM models on this host
    rocmdoctor lemonade apply --check    the options rocmdoctor would save (Lemonade's dry run), as a diff
    rocmdoctor lemonade apply            save them through /api/v1/models/{id}/options
    rocmdoctor lemonade verify           load, smoke through Lemonade, vLLM's /metrics via backend_url
    rocmdoctor lemonade install-backend  POST /api/v1/install {"recipe": "vllm", "backend": "rocm"}
    """


@lemonade.command("check")
@pass_app
@_options
def check_cmd(
    app: App,
    target: Target,
) -> None:
    """Diagnose: the host checks, Lemonade's timeout, orphaned EngineCores, and each vLLM model's memory
    and context. Exit 0: no failure; 1: a failure; 2: Lemonade cannot be used."""
    from rocmdoctor.commands.lemonade_targets import diagnose, host_context
    from rocmdoctor.model import envelope, exit_code
    from rocmdoctor.provision.server.lemonade_api import LemonadeError
    from rocmdoctor.rendering.rows import row_lines

    client = _client(app, target)
    try:
        health, findings = diagnose(host_context(app), client, target.models)
    except LemonadeError as exc:
        _fail(exc, target.as_json)
    code = exit_code([row.status for row in findings])
    if target.as_json:
        emit_json(
            envelope(
                ok=code == 0,
                url=client.base_url,
                version=health.get("version"),
                findings=[row.to_json() for row in findings],
                exit_code=code,
            )
        )
    else:
        click.echo(f"Lemonade {health.get('version', '?')} at {client.base_url}")
        click.echo("\n".join(row_lines(findings)))
    sys.exit(code)


@lemonade.command("apply")
@pass_app
@click.option(
    "--check", "check_only", is_flag=True, help="Dry run: Lemonade validates and resolves; nothing saved."
)
@click.option(
    "--bench-report",
    type=params.NonEmptyPath(path_type=Path, dir_okay=False),
    default=None,
    help="A `rocmdoctor bench --json` report: --max-num-seqs from its measured knee.",
)
@click.option(
    "--no-verify",
    "skip_verify",
    is_flag=True,
    help="Save only: do not load each model through Lemonade and smoke it afterwards.",
)
@_options
def apply_cmd(
    app: App,
    target: Target,
    check_only: bool,
    bench_report: Path | None,
    skip_verify: bool,
) -> None:
    """Save each vLLM model's ctx_size, --gpu-memory-utilization and --max-num-seqs through Lemonade's
    options API (merged: other saved keys stay), then load each through Lemonade and smoke it there, as
    `lemonade verify` does. A rerun changes nothing. Exit 0; 1: a model saved does not serve; 2: an
    error."""
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.provision.server.lemonade_api import LemonadeError

    writer = HostWriter(check_mode=check_only)  # the Target of Lemonade's API: nothing sent under --check
    client = _client(app, target)
    changes, timeout = _save_options(app, writer, client, target, bench_report)
    verified: list[dict[str, Any]] = []
    if not check_only and not skip_verify:
        try:
            for c in changes:
                report, *_ = _load_and_smoke(client, target, c.data["model"])
                verified.append(
                    {"model": c.data["model"]} | {k: v for k, v in report.items() if k != "schema_version"}
                )
        except LemonadeError as exc:
            _fail(exc, target.as_json)
    emit_change(
        _applied(writer, changes, timeout, verified),
        target.as_json,
        _applied_lines(writer, changes, timeout, verified),
    )
    sys.exit(max((r["exit_code"] for r in verified), default=0))


def _save_options(
    app: App, writer: HostWriter, client: Lemonade, target: Target, bench_report: Path | None
) -> tuple[list[Change], Change]:
    """Each vLLM model's options and the global timeout, through the writer: (the models' changes, the
    timeout's change). No vLLM model is a clear error (exit 2)."""
    from rocmdoctor.commands.lemonade_targets import (
        bench_knee,
        checkpoint,
        compute_target,
        host_context,
        vllm_models,
    )
    from rocmdoctor.provision.server.lemonade import apply_options, apply_timeout
    from rocmdoctor.provision.server.lemonade_api import LemonadeError

    knee, knee_why = bench_knee(bench_report)
    ctx = host_context(app)
    changes: list[Change] = []
    timeout = None
    try:
        loaded = {m.get("model_name") for m in client.health().get("all_models_loaded", [])}
        entries = vllm_models(client, target.models)
        for entry in entries:
            wanted = compute_target(ctx, entry, knee, knee_why)
            if entry["id"] in loaded:
                wanted.notes.append(
                    "the model is loaded now: its memory is not free, so the utilization is conservative; "
                    "saved options apply at its next load (POST /api/v1/unload, then load)"
                )
            changes.append(apply_options(writer, client, wanted))
        if changes:
            timeout = apply_timeout(writer, client, [checkpoint(e) for e in entries])
    except LemonadeError as exc:
        _fail(exc, target.as_json)
    if not changes:
        _fail(
            UserError("Lemonade has no model with the vllm recipe; register one with `lemonade pull`"),
            target.as_json,
        )
    assert timeout is not None  # set whenever changes is
    return changes, timeout


def _applied(
    writer: HostWriter, changes: list[Change], timeout: Change, verified: list[dict[str, Any]]
) -> Change:
    """`lemonade apply`'s one envelope: the models', the timeout's and the verification's."""
    from rocmdoctor.model import Change

    return Change(
        any(c.changed for c in changes) or timeout.changed,
        "; ".join(c.msg for c in [*changes, timeout] if c.changed) or "the saved options already match",
        "".join(c.diff_text() for c in [*changes, timeout]),
        {
            "check": writer.check_mode,
            "models": [c.data | {"changed": c.changed, "msg": c.msg} for c in changes],
            "global_timeout": timeout.data | {"changed": timeout.changed, "msg": timeout.msg},
            "verify": verified,
        },
    )


def _applied_lines(
    writer: HostWriter, changes: list[Change], timeout: Change, verified: list[dict[str, Any]]
) -> list[str]:
    word = writer.past("changed", "change")
    details = []
    for c in changes:
        details.append(f"{word if c.changed else 'ok'} {c.data['model']}")
        details += [f"  {key}: {why}" for key, why in c.data["reasons"].items()]
        details += [f"  note: {note}" for note in c.data["notes"]]
    details.append(f"{word if timeout.changed else 'ok'} global_timeout: {timeout.msg}")
    for report in verified:
        details.append(f"loaded {report['model']} through Lemonade and smoked it there:")
        details += [f"  {line}" for line in _step_lines(report["steps"])]
    return details


def _step_lines(steps: list[dict[str, Any]]) -> list[str]:
    """Smoke's steps through Lemonade, a line each (by title), the remedy under a failed one."""
    lines = []
    for step in steps:
        lines.append(f"{step['status'].upper():5} {step['title']}: {step['summary']}")
        if step["remedy"]:
            lines.append(f"      -> {step['remedy']}")
    return lines


@lemonade.command("verify")
@pass_app
@_options
def verify_cmd(
    app: App,
    target: Target,
) -> None:
    """Load the model through Lemonade, smoke it through Lemonade's OpenAI endpoint, and read vLLM's own
    /metrics at backend_url. Exit 0: it serves; 1: a step failed; 2: Lemonade cannot be used."""
    from rocmdoctor.commands.lemonade_targets import vllm_models
    from rocmdoctor.model import envelope
    from rocmdoctor.provision.server.lemonade_api import LemonadeError
    from rocmdoctor.rendering.rows import row_lines

    client = _client(app, target)
    try:
        entries = vllm_models(client, target.models)
        if not entries:
            raise LemonadeError(
                "rejected", "Lemonade has no model with the vllm recipe; register one with `lemonade pull`"
            )
        model = str(entries[0]["id"])
        report, entry, backend, backend_base = _load_and_smoke(client, target, model)
    except LemonadeError as exc:
        _fail(exc, target.as_json)
    launch = entry.get("launch_command") if entry else None
    findings = _backend_findings(client, model, launch, backend_base)
    report["lemonade"] = {
        "model": model,
        "backend_url": backend,
        "launch_command": launch if isinstance(launch, list) else None,
        "findings": [row.to_json() for row in findings],
        "note": None
        if backend_base
        else "no loopback backend_url in /api/v1/health: /metrics read through Lemonade",
    }
    if target.as_json:
        emit_json(envelope(**{k: v for k, v in report.items() if k != "schema_version"}))
    else:
        click.echo(f"loaded {model} through Lemonade at {client.base_url}; vLLM backend {backend or '?'}")
        for line in _step_lines(report["steps"]):
            click.echo(line)
        if findings:
            click.echo("\n".join(row_lines(findings)))
    sys.exit(report["exit_code"])


def _load_and_smoke(client: Any, target: Target, model: str) -> tuple[dict[str, Any], Any, Any, str | None]:
    """Load `model` through Lemonade (within its global_timeout) and smoke it through Lemonade's OpenAI
    endpoint, reading vLLM's own /metrics at a loopback backend_url: what verify does, and what apply
    does after it saves. Returns smoke's report, the model's health entry, its backend_url and the
    base of it smoke read. LemonadeError when Lemonade cannot load it."""
    from rocmdoctor.provision.verify.smoke import SmokeOptions, run_smoke

    config = client.config()
    load_s = config.get("global_timeout") if isinstance(config.get("global_timeout"), int) else 600
    client.load(model, max(float(load_s or 0), target.timeout_s) + 30)
    health = client.health()
    entry = next((m for m in health["all_models_loaded"] if m.get("model_name") == model), None)
    backend = entry.get("backend_url") if entry else None
    backend_base = None
    if isinstance(backend, str) and re.match(
        r"^https?://(127\.0\.0\.1|localhost|\[::1\])(:\d+)?(/|$)", backend
    ):
        backend_base = backend.rstrip("/").removesuffix("/v1")
    report = run_smoke(
        SmokeOptions(
            client.base_url + "/api",
            model,
            client.key,
            max(target.timeout_s, 30.0),
            "/v1/health",
            backend_base,
        )
    )
    return report, entry, backend, backend_base


def _backend_findings(client: Any, model: str, launch: Any, backend_base: str | None) -> list[Row]:
    """What the running vLLM got (its launch_command against the saved options) and whether Lemonade's
    telemetry can read its KV-cache gauge; advisory: a warning, never the verdict."""
    from rocmdoctor.model import Row, warned
    from rocmdoctor.provision.server import lemonade as lm
    from rocmdoctor.provision.server.lemonade_api import LemonadeError
    from rocmdoctor.provision.verify import prometheus
    from rocmdoctor.provision.verify.memory import MetricsError, read_metrics

    rows = []
    try:
        rows.append(Row("lemonade.launch", lm.diagnose_launch(launch, client.options(model)["saved"])))
    except LemonadeError as exc:
        rows.append(
            Row("lemonade.launch", warned(f"the saved options cannot be read: {exc}", "rerun verify"))
        )
    if backend_base:
        try:
            names = {s.name for s in prometheus.parse(read_metrics(backend_base + "/metrics", 10.0))}
            rows.append(Row("lemonade.telemetry", lm.diagnose_telemetry(names)))
        except (MetricsError, prometheus.MetricsFormatError) as exc:
            rows.append(
                Row("lemonade.telemetry", warned(f"vLLM's /metrics: {exc}", "read it at backend_url"))
            )
    return rows


@lemonade.command("install-backend")
@pass_app
@click.option("--check", "check_only", is_flag=True, help="Say whether it would install; install nothing.")
@click.option("--backend", default="rocm", show_default=True, help="The vllm backend Lemonade installs.")
@_options
def install_backend_cmd(
    app: App,
    target: Target,
    check_only: bool,
    backend: str,
) -> None:
    """Install Lemonade's vLLM backend through its API (idempotent: nothing when it is installed)."""
    from rocmdoctor.model import Change
    from rocmdoctor.provision.server.lemonade import diagnose_backend
    from rocmdoctor.provision.server.lemonade_api import LemonadeError

    if not re.fullmatch(r"[a-z0-9_-]{1,32}", backend):
        raise UserError(f"--backend {backend!r}: a backend name such as rocm")
    client = _client(app, target)
    try:
        before = diagnose_backend(client.system_info(), [], backend)
        state = before.details.get("state")
        diff = f"-vllm:{backend}: {state}\n+vllm:{backend}: installed\n"
        if state == "installed":
            change = Change(False, f"vllm:{backend} is installed", "", {"check": check_only, "state": state})
        elif check_only:
            change = Change(
                True, f"would install vllm:{backend} (now {state})", diff, {"check": True, "state": state}
            )
        else:
            client.install("vllm", backend, max(target.timeout_s, 1800.0))
            data = {"check": False, "state": "installed", "was": state}
            change = Change(True, f"installed vllm:{backend}", diff, data)
    except LemonadeError as exc:
        _fail(exc, target.as_json)
    emit_change(change, target.as_json)
