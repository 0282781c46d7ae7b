"""`rocmdoctor lemonade`: Lemonade Server as the target: diagnose its vLLM models, apply the options
rocmdoctor computes through Lemonade's options API, verify through its OpenAI endpoint.

The one place the diagnosis (host checks, the GPU's free memory) meets Lemonade (provision.lemonade).
The admin key comes from --admin-key-file or LEMONADE_ADMIN_API_KEY / LEMONADE_API_KEY (Lemonade's own
clients prefer the admin key the same way) and never appears in any output.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from .. import params
from .common import App, UserError, emit_json, pass_app

KEY_ENV = ("LEMONADE_ADMIN_API_KEY", "LEMONADE_API_KEY")
MAX_BENCH_REPORT_BYTES = 4 << 20


def _options(fn: Any) -> Any:
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
        default=None,
        envvar="ROCMDOCTOR_LEMONADE_URL",
        help="Lemonade Server (default: the port in /var/lib/lemonade/config.json, else 13305 on loopback).",
    )(fn)
    return fn


def _key(path: Path | None) -> str | None:
    from ..sensitive import API_KEY_PATTERN, KeyFileError, read_api_key

    if path is not None:
        try:
            return read_api_key(path, where=f"--admin-key-file {path}")
        except KeyFileError as exc:
            raise UserError(f"{exc}; write the key lemond was started with into it") from None
    for name in KEY_ENV:
        value = os.environ.get(name, "").strip()
        if value:
            if not API_KEY_PATTERN.fullmatch(value):
                raise UserError(
                    f"{name} holds characters a Bearer token cannot carry; set it to the key itself"
                )
            return value
    return None


def _url(app: App, url: str | None) -> str:
    from ..provision.lemonade_api import CONFIG_FILES, DEFAULT_PORT
    from ..provision.openai_client import normalize_url

    if not url:
        port = DEFAULT_PORT
        host = app.host()
        for path in CONFIG_FILES:  # read only: never written under a running server
            read = host.read_text(path, limit=1 << 20)
            if not read.ok:
                continue
            try:
                doc = json.loads(read.value)
            except json.JSONDecodeError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("port"), int) and 0 < doc["port"] < 65536:
                port = doc["port"]
        url = f"http://127.0.0.1:{port}"
    try:
        return normalize_url(url).removesuffix("/api")
    except ValueError as exc:
        raise UserError(f"--url: {exc}") from None


def _client(app: App, url: str | None, key_file: Path | None, timeout_s: float) -> Any:
    from ..provision.lemonade_api import Lemonade

    return Lemonade(_url(app, url), _key(key_file), timeout_s)


def _fail(exc: Exception, as_json: bool) -> NoReturn:
    """A Lemonade that cannot be used: a clear finding and exit 2."""
    kind = getattr(exc, "kind", "error")
    if as_json:
        from ..model import envelope

        emit_json(envelope(ok=False, error={"kind": kind, "message": str(exc)}))
        sys.exit(2)
    raise UserError(str(exc))


def _vllm_models(client: Any, wanted: tuple[str, ...]) -> list[dict[str, Any]]:
    from ..provision.lemonade_api import VLLM_RECIPE, LemonadeError

    models = client.models()
    by_id = {m["id"]: m for m in models}
    if wanted:
        missing = [m for m in wanted if m not in by_id]
        if missing:
            raise LemonadeError(
                "rejected",
                f"Lemonade has no model {', '.join(missing)}; register it: `lemonade pull user.NAME "
                "--checkpoint main ORG/REPO --recipe vllm`",
            )
        chosen = [by_id[m] for m in wanted]
        other = [m["id"] for m in chosen if m.get("recipe") != VLLM_RECIPE]
        if other:
            raise LemonadeError(
                "rejected", f"{', '.join(other)}: not a vllm-recipe model; rocmdoctor tunes vLLM models"
            )
        return chosen
    return [m for m in models if m.get("recipe") == VLLM_RECIPE]


def _checkpoint(entry: dict[str, Any]) -> str:
    checkpoint = entry.get("checkpoint")
    return checkpoint if isinstance(checkpoint, str) and checkpoint else str(entry["id"])


def _bench_knee(path: Path | None) -> tuple[int | None, str | None]:
    """--max-num-seqs from a `rocmdoctor bench --json` report: its knee, when one was measured."""
    if path is None:
        return None, None
    from ..rootfs import read_regular

    try:
        raw = read_regular(path, MAX_BENCH_REPORT_BYTES)
        doc = json.loads(raw.decode("utf-8"))
    except OSError as exc:
        raise UserError(f"--bench-report {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise UserError(
            f"--bench-report {path}: not JSON; give the output of `rocmdoctor bench --json`"
        ) from None
    knee = doc.get("knee") if isinstance(doc, dict) else None
    if not isinstance(knee, dict):
        raise UserError(f"--bench-report {path}: no `knee`; give the output of `rocmdoctor bench --json`")
    seqs = knee.get("recommended_max_num_seqs")
    if seqs is None:
        return None, f"the bench found no knee ({knee.get('advice', 'throughput still rising')})"
    if isinstance(seqs, bool) or not isinstance(seqs, int) or not 0 < seqs <= 65536:
        raise UserError(
            f"--bench-report {path}: knee.recommended_max_num_seqs is not a positive whole number"
        )
    rate = knee.get("output_tokens_per_s")
    rate_text = (
        f" ({rate:.0f} tokens/s)" if isinstance(rate, (int, float)) and not isinstance(rate, bool) else ""
    )
    return (
        seqs,
        f"the measured knee{rate_text}: more concurrent sequences add little throughput (rocmdoctor bench)",
    )


def _host_context(app: App) -> Any:
    from ..registry import Context, Options

    return Context(app.host(), Options())


def compute_target(ctx: Any, entry: dict[str, Any], knee: int | None, knee_why: str | None) -> Any:
    """ctx_size, --gpu-memory-utilization and --max-num-seqs for one model, from this host's free memory
    (memory_rule), the model's memory plan and the bench knee: the same resolve() `unit` uses."""
    from ..provision.lemonade import ModelTarget
    from ..provision.server_args import ArgumentError, Choices, resolve
    from .host_pools import pools_from_facts

    model = str(entry["id"])
    try:
        args = resolve(Choices(model=_checkpoint(entry), max_num_seqs=knee), pools_from_facts(ctx))
    except ArgumentError as exc:
        raise UserError(f"{model}: {exc}") from None
    settings = {s.flag: s for s in args.settings}
    flags: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for flag in ("--gpu-memory-utilization", "--max-num-seqs"):
        if flag in settings:
            flags[flag] = settings[flag].value
            reasons[flag] = (
                knee_why if flag == "--max-num-seqs" and knee and knee_why else settings[flag].reason
            )
    notes = [n for n in args.notes if not n.startswith("GPUs not pinned")]
    if knee is None and knee_why:
        notes.append(knee_why)
    ctx_size = None
    if "--max-model-len" in settings:
        ctx_size, reasons["ctx_size"] = (
            int(settings["--max-model-len"].value),
            settings["--max-model-len"].reason,
        )
    elif args.plan is not None and args.plan.max_model_len:
        ctx_size = int(args.plan.max_model_len)
        reasons["ctx_size"] = f"the model's own {ctx_size} tokens fit the KV cache (rocmdoctor plan)"
    return ModelTarget(model, ctx_size, flags, reasons, notes)


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
@_options
@pass_app
def check_cmd(
    app: App,
    url: str | None,
    admin_key_file: Path | None,
    models: tuple[str, ...],
    timeout_s: float,
    as_json: bool,
) -> None:
    """Diagnose: the host checks, Lemonade's timeout, orphaned EngineCores, and each vLLM model's memory
    and context. Exit 0: no failure; 1: a failure; 2: Lemonade cannot be used."""
    from ..checks import load_registry
    from ..model import Status, envelope, exit_code
    from ..provision import lemonade as lm
    from ..provision.lemonade_api import VLLM_RECIPE, LemonadeError

    client = _client(app, url, admin_key_file, timeout_s)
    ctx = _host_context(app)
    registry = load_registry()
    outcomes = registry.run(ctx, registry.select())
    findings: list[tuple[str, Any]] = []
    bad = [o for o in outcomes if o.result.status in (Status.FAIL, Status.ERROR)]
    host_summary = "; ".join(f"{o.spec.id}: {o.result.summary}" for o in bad)
    from ..model import failed, passed, warned

    findings.append(
        (
            "host",
            failed(f"{len(bad)} host check(s) fail: {host_summary}", "rocmdoctor check (the remedies)")
            if bad
            else passed(f"{len(outcomes)} host checks, none fails"),
        )
    )
    try:
        health = client.health()
        config = client.config()
        entries = _vllm_models(client, models)
        info = client.system_info()
        loaded = [m for m in health.get("all_models_loaded", []) if m.get("recipe") == VLLM_RECIPE]
        pids = [m["pid"] for m in loaded if isinstance(m.get("pid"), int)]
        orphans = next((o for o in outcomes if o.spec.id == "processes.orphans"), None)
        procs = orphans.result.details.get("gpu_processes", []) if orphans else []
        findings.append(("lemonade.timeout", lm.diagnose_timeout(config, [_checkpoint(e) for e in entries])))
        findings.append(("lemonade.orphans", lm.diagnose_orphans(procs, pids)))
        backend = _backend_state(info)
        launched = [m.get("launch_command") for m in loaded if isinstance(m.get("launch_command"), list)]
        if launched and launched[0] and isinstance(launched[0][0], str):
            from dataclasses import replace

            where = launched[0][0]  # where Lemonade's vllm-server lives
            backend = replace(
                backend,
                summary=f"{backend.summary} at {where}",
                details=backend.details | {"executable": where},
            )
        findings.append(("lemonade.backend", backend))
        from .host_pools import pools_from_facts

        pools = pools_from_facts(ctx)
        pool = pools[0] if pools else None
        global_args = _global_vllm_args(config)
        for entry in entries:
            model = str(entry["id"])
            options = client.options(model)
            effective = options["effective"]
            args_text = " ".join(
                a
                for a in (
                    global_args,
                    effective.get("vllm_args") if isinstance(effective.get("vllm_args"), str) else "",
                )
                if a
            )
            try:
                target = compute_target(ctx, entry, None, None)
            except UserError as exc:
                findings.append(
                    (
                        f"{model}.plan",
                        warned(
                            f"no settings computed: {exc.message}",
                            "rocmdoctor check (the GPU's memory), rocmdoctor plan --model "
                            + _checkpoint(entry),
                        ),
                    )
                )
                continue
            util = target.flags.get("--gpu-memory-utilization")
            findings.append(
                (
                    f"{model}.memory",
                    lm.diagnose_utilization(
                        model,
                        args_text,
                        pool.total if pool else None,
                        pool.free if pool else None,
                        float(util) if util else None,
                    ),
                )
            )
            findings.append(
                (
                    f"{model}.ctx_size",
                    lm.diagnose_ctx(
                        model, effective.get("ctx_size"), options.get("resolved_ctx_size"), target.ctx_size
                    ),
                )
            )
    except LemonadeError as exc:
        _fail(exc, as_json)
    code = exit_code([r.status for _, r in findings])
    if as_json:
        emit_json(
            envelope(
                ok=code == 0,
                url=client.base_url,
                version=health.get("version"),
                findings=[
                    {
                        "id": i,
                        "status": r.status.value,
                        "summary": r.summary,
                        "remedy": r.remedy,
                        "details": r.details,
                    }
                    for i, r in findings
                ],
                exit_code=code,
            )
        )
    else:
        click.echo(f"Lemonade {health.get('version', '?')} at {client.base_url}")
        for ident, result in findings:
            click.echo(f"{result.status.value.upper():5} {ident}: {result.summary}")
            if result.remedy:
                click.echo(f"      -> {result.remedy}")
    sys.exit(code)


def _global_vllm_args(config: dict[str, Any]) -> str:
    """`vllm.args` of the runtime config (`lemonade config set vllm.args=...`), merged into every load."""
    section = config.get("vllm")
    args = section.get("args") if isinstance(section, dict) else config.get("vllm_args")
    return args if isinstance(args, str) else ""


def _backend_state(info: dict[str, Any]) -> Any:
    from ..model import failed, passed, warned

    recipes = info.get("recipes")
    rocm = None
    if isinstance(recipes, dict) and isinstance(recipes.get("vllm"), dict):
        backends = recipes["vllm"].get("backends")
        rocm = backends.get("rocm") if isinstance(backends, dict) else None
    if not isinstance(rocm, dict):
        return warned(
            "Lemonade lists no vllm:rocm backend",
            "upgrade Lemonade (vLLM arrived as an experimental backend)",
        )
    state, version = rocm.get("state"), rocm.get("version")
    if state == "installed":
        return passed(f"vllm:rocm installed ({version or 'version not given'})", version=version)
    action = rocm.get("action") if isinstance(rocm.get("action"), str) and rocm.get("action") else ""
    return failed(
        f"vllm:rocm is {state}: {rocm.get('message') or ''}".rstrip(": "),
        action or "rocmdoctor lemonade install-backend",
        state=state,
    )


@lemonade.command("apply")
@_options
@click.option(
    "--check", "check_only", is_flag=True, help="Dry run: Lemonade validates and resolves; nothing saved."
)
@click.option(
    "--bench-report",
    type=params.NonEmptyPath(path_type=Path, dir_okay=False),
    default=None,
    help="A `rocmdoctor bench --json` report: --max-num-seqs from its measured knee.",
)
@pass_app
def apply_cmd(
    app: App,
    url: str | None,
    admin_key_file: Path | None,
    models: tuple[str, ...],
    timeout_s: float,
    as_json: bool,
    check_only: bool,
    bench_report: Path | None,
) -> None:
    """Save each vLLM model's ctx_size, --gpu-memory-utilization and --max-num-seqs through Lemonade's
    options API (merged: other saved keys stay). A rerun changes nothing. Exit 0, or 2 on an error."""
    from ..model import Change
    from ..provision.lemonade import apply_options, apply_timeout
    from ..provision.lemonade_api import LemonadeError

    knee, knee_why = _bench_knee(bench_report)
    client = _client(app, url, admin_key_file, timeout_s)
    ctx = _host_context(app)
    changes: list[Change] = []
    timeout = None
    try:
        loaded = {m.get("model_name") for m in client.health().get("all_models_loaded", [])}
        entries = _vllm_models(client, models)
        for entry in entries:
            target = compute_target(ctx, entry, knee, knee_why)
            if entry["id"] in loaded:
                target.notes.append(
                    "the model is loaded now: its memory is not free, so the utilization is conservative; "
                    "saved options apply at its next load (POST /api/v1/unload, then load)"
                )
            changes.append(apply_options(client, target, check_only))
        if changes:
            timeout = apply_timeout(client, [_checkpoint(e) for e in entries], check_only)
    except LemonadeError as exc:
        _fail(exc, as_json)
    if not changes:
        _fail(
            UserError("Lemonade has no model with the vllm recipe; register one with `lemonade pull`"),
            as_json,
        )
    assert timeout is not None  # set whenever changes is
    change = Change(
        any(c.changed for c in changes) or timeout.changed,
        "; ".join(c.msg for c in [*changes, timeout] if c.changed) or "the saved options already match",
        "".join(c.diff for c in [*changes, timeout]),
        {
            "check": check_only,
            "models": [c.data | {"changed": c.changed, "msg": c.msg} for c in changes],
            "global_timeout": timeout.data | {"changed": timeout.changed, "msg": timeout.msg},
        },
    )
    if as_json:
        emit_json(change.envelope())
        return
    word = "would change" if check_only else "changed"
    for c in changes:
        click.echo(f"{word if c.changed else 'ok'} {c.data['model']}")
        for key, why in c.data["reasons"].items():
            click.echo(f"  {key}: {why}")
        for note in c.data["notes"]:
            click.echo(f"  note: {note}")
        if c.diff:
            click.echo(c.diff.rstrip("\n"))
    click.echo(f"{word if timeout.changed else 'ok'} global_timeout: {timeout.msg}")
    if timeout.diff:
        click.echo(timeout.diff.rstrip("\n"))
    click.echo(f"changed={str(change.changed).lower()}")


@lemonade.command("verify")
@_options
@pass_app
def verify_cmd(
    app: App,
    url: str | None,
    admin_key_file: Path | None,
    models: tuple[str, ...],
    timeout_s: float,
    as_json: bool,
) -> None:
    """Load the model through Lemonade, smoke it through Lemonade's OpenAI endpoint, and read vLLM's own
    /metrics at backend_url. Exit 0: it serves; 1: a step failed; 2: Lemonade cannot be used."""
    from ..model import envelope
    from ..provision.lemonade_api import LemonadeError
    from ..provision.smoke import SmokeOptions, run_smoke

    client = _client(app, url, admin_key_file, timeout_s)
    try:
        entries = _vllm_models(client, models)
        if not entries:
            raise LemonadeError(
                "rejected", "Lemonade has no model with the vllm recipe; register one with `lemonade pull`"
            )
        model = str(entries[0]["id"])
        config = client.config()
        load_s = config.get("global_timeout") if isinstance(config.get("global_timeout"), int) else 600
        client.load(model, max(float(load_s or 0), timeout_s) + 30)
        health = client.health()
    except LemonadeError as exc:
        _fail(exc, as_json)
    entry = next((m for m in health["all_models_loaded"] if m.get("model_name") == model), None)
    backend = entry.get("backend_url") if entry else None
    backend_base = None
    if isinstance(backend, str) and re.match(
        r"^https?://(127\.0\.0\.1|localhost|\[::1\])(:\d+)?(/|$)", backend
    ):
        backend_base = backend.rstrip("/").removesuffix("/v1")
    report = run_smoke(
        SmokeOptions(
            client.base_url + "/api", model, client.key, max(timeout_s, 30.0), "/v1/health", backend_base
        )
    )
    launch = entry.get("launch_command") if entry else None
    report["lemonade"] = {
        "model": model,
        "backend_url": backend,
        "launch_command": launch if isinstance(launch, list) else None,
        "note": None
        if backend_base
        else "no loopback backend_url in /api/v1/health: /metrics read through Lemonade",
    }
    if as_json:
        emit_json(envelope(**{k: v for k, v in report.items() if k != "schema_version"}))
    else:
        click.echo(f"loaded {model} through Lemonade at {client.base_url}; vLLM backend {backend or '?'}")
        for step in report["steps"]:
            click.echo(f"{step['status'].upper():5} {step['title']}: {step['summary']}")
            if step["remedy"]:
                click.echo(f"      -> {step['remedy']}")
    sys.exit(report["exit_code"])


@lemonade.command("install-backend")
@_options
@click.option("--check", "check_only", is_flag=True, help="Say whether it would install; install nothing.")
@click.option("--backend", default="rocm", show_default=True, help="The vllm backend Lemonade installs.")
@pass_app
def install_backend_cmd(
    app: App,
    url: str | None,
    admin_key_file: Path | None,
    models: tuple[str, ...],
    timeout_s: float,
    as_json: bool,
    check_only: bool,
    backend: str,
) -> None:
    """Install Lemonade's vLLM backend through its API (idempotent: nothing when it is installed)."""
    from ..model import Change
    from ..provision.lemonade_api import LemonadeError

    if not re.fullmatch(r"[a-z0-9_-]{1,32}", backend):
        raise UserError(f"--backend {backend!r}: a backend name such as rocm")
    client = _client(app, url, admin_key_file, timeout_s)
    try:
        before = _backend_state(client.system_info())
        state = before.details.get("state", "installed" if before.status.value == "pass" else None)
        if state == "installed":
            change = Change(False, f"vllm:{backend} is installed", "", {"state": state})
        elif check_only:
            change = Change(True, f"would install vllm:{backend} (now {state})", "", {"state": state})
        else:
            client.install("vllm", backend, max(timeout_s, 1800.0))
            change = Change(True, f"installed vllm:{backend}", "", {"state": "installed", "was": state})
    except LemonadeError as exc:
        _fail(exc, as_json)
    if as_json:
        emit_json(change.envelope())
    else:
        click.echo(change.msg)
        click.echo(f"changed={str(change.changed).lower()}")
