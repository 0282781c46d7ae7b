"""Lemonade's vLLM models joined with this host: the settings rocmdoctor computes for each (the same
resolve() `unit` uses: the free-memory rule, the model's memory plan, a bench knee) and the diagnosis
`rocmdoctor lemonade check` reports. The one place the host's diagnosis meets Lemonade's answers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rocmdoctor.commands.common import App, UserError
from rocmdoctor.documents import DocumentError, load_value
from rocmdoctor.model import Row, Status, failed, passed, warned
from rocmdoctor.provision.server import lemonade as lm
from rocmdoctor.provision.server.lemonade_api import VLLM_RECIPE, Lemonade, LemonadeError
from rocmdoctor.registry import Context, Options

MAX_BENCH_REPORT_BYTES = 4 << 20


def host_context(app: App) -> Context:
    return Context(app.host(), Options())


def vllm_models(client: Lemonade, wanted: tuple[str, ...]) -> list[dict[str, Any]]:
    """The models asked for (each must exist and use the vllm recipe), or every vllm-recipe model."""
    models = client.models()
    by_id = {m["id"]: m for m in models}
    if not wanted:
        return [m for m in models if m.get("recipe") == VLLM_RECIPE]
    found = {m: listed_id(m, by_id) for m in wanted}
    missing = [m for m, ident in found.items() if ident is None]
    if missing:
        raise LemonadeError(
            "rejected",
            f"Lemonade has no model {', '.join(missing)}; register it: `lemonade pull user.NAME "
            "--checkpoint main ORG/REPO --recipe vllm`",
        )
    chosen = [by_id[ident] for ident in found.values() if ident is not None]
    other = [m["id"] for m in chosen if m.get("recipe") != VLLM_RECIPE]
    if other:
        raise LemonadeError(
            "rejected", f"{', '.join(other)}: not a vllm-recipe model; rocmdoctor tunes vLLM models"
        )
    return chosen


BUILTIN = "builtin."


def listed_id(wanted: str, by_id: dict[str, Any]) -> str | None:
    """The id Lemonade lists for the model the user named. A built-in has two spellings: its canonical
    id `builtin.NAME` and the bare NAME, which /v1/models lists for the winner of a name (registered >
    imported > built-in), so an unshadowed built-in is listed bare and a shadowed one as builtin.NAME
    (lemonade-sdk/lemonade @ e385039: docs/guide/configuration/custom-models.md, recipe_options.json
    keys `user.NAME | extra.NAME | builtin.NAME`). The listed id is the one sent back."""
    if wanted in by_id:
        return wanted
    if wanted.startswith(BUILTIN) and wanted[len(BUILTIN) :] in by_id:
        return wanted[len(BUILTIN) :]
    if BUILTIN + wanted in by_id:
        return BUILTIN + wanted
    return None


def checkpoint(entry: dict[str, Any]) -> str:
    value = entry.get("checkpoint")
    return value if isinstance(value, str) and value else str(entry["id"])


def bench_knee(path: Path | None) -> tuple[int | None, str | None]:
    """--max-num-seqs from a `rocmdoctor bench --json` report: its knee, when one was measured."""
    if path is None:
        return None, None
    from rocmdoctor.documents import DocumentError, load_value
    from rocmdoctor.rootfs import read_regular

    try:
        doc = load_value(read_regular(path, MAX_BENCH_REPORT_BYTES), "--bench-report", MAX_BENCH_REPORT_BYTES)
    except OSError as exc:
        raise UserError(f"--bench-report {path}: {exc.strerror or exc}") from None
    except DocumentError as exc:
        raise UserError(
            f"--bench-report {path}: {exc.why}; give the output of `rocmdoctor bench --json`"
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


def compute_target(
    ctx: Context, entry: dict[str, Any], knee: int | None, knee_why: str | None
) -> lm.ModelTarget:
    """ctx_size, --gpu-memory-utilization and --max-num-seqs for one model, from this host's free memory
    (memory_rule), the model's memory plan and the bench knee: the same resolve() `unit` uses."""
    from rocmdoctor.commands.host_pools import pools_from_facts
    from rocmdoctor.provision.server.args import ArgumentError, Choices, resolve

    model = str(entry["id"])
    try:
        args = resolve(Choices(model=checkpoint(entry), max_num_seqs=knee), pools_from_facts(ctx))
    except ArgumentError as exc:
        raise UserError(f"{model}: {exc}") from None
    settings = {s.flag: s for s in args.settings}
    flags: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for flag in ("--gpu-memory-utilization", "--max-num-seqs"):
        if flag in settings:
            flags[flag] = settings[flag].value
            from_knee = flag == "--max-num-seqs" and knee and knee_why
            reasons[flag] = knee_why if from_knee and knee_why else settings[flag].reason
    notes = list(args.notes)
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
    return lm.ModelTarget(model, ctx_size, flags, reasons, notes)


def diagnose(ctx: Context, client: Lemonade, models: tuple[str, ...]) -> tuple[dict[str, Any], list[Row]]:
    """Lemonade's health answer and the findings: the host checks, then Lemonade's (LemonadeError when
    Lemonade cannot be used)."""
    from rocmdoctor.checks import load_registry
    from rocmdoctor.commands.host_pools import pools_from_facts

    registry = load_registry()
    outcomes = registry.run(ctx, registry.select())
    bad = [o for o in outcomes if o.result.status in (Status.FAIL, Status.ERROR)]
    findings: list[Row] = [
        Row(
            "host",
            failed(
                f"{len(bad)} host check(s) fail: "
                + "; ".join(f"{o.spec.id}: {o.result.summary}" for o in bad),
                "rocmdoctor check (the remedies)",
            )
            if bad
            else passed(f"{len(outcomes)} host checks, none fails"),
        )
    ]
    health = client.health()
    config = client.config()
    entries = vllm_models(client, models)
    loaded = [m for m in health.get("all_models_loaded", []) if m.get("recipe") == VLLM_RECIPE]
    pids = [m["pid"] for m in loaded if isinstance(m.get("pid"), int)]
    orphans = next((o for o in outcomes if o.spec.id == "processes.orphans"), None)
    processes = orphans.result.details.get("gpu_processes", []) if orphans else []
    findings.append(Row("lemonade.timeout", lm.diagnose_timeout(config, [checkpoint(e) for e in entries])))
    findings.append(Row("lemonade.orphans", lm.diagnose_orphans(processes, pids)))
    findings.append(Row("lemonade.backend", lm.diagnose_backend(client.system_info(), loaded)))
    pools = pools_from_facts(ctx)
    pool = pools[0] if pools else None
    for entry in entries:
        model = str(entry["id"])
        options = client.options(model)
        try:
            target = compute_target(ctx, entry, None, None)
        except UserError as exc:
            remedy = f"rocmdoctor check (the GPU's memory), rocmdoctor plan --model {checkpoint(entry)}"
            findings.append(Row(f"{model}.plan", warned(f"no settings computed: {exc.message}", remedy)))
            continue
        util = target.flags.get("--gpu-memory-utilization")
        args_text = lm.effective_vllm_args(config, options["effective"])
        total, free = (pool.total, pool.free) if pool else (None, None)
        findings.append(
            Row(
                f"{model}.memory",
                lm.diagnose_utilization(model, args_text, total, free, float(util) if util else None),
            )
        )
        ctx_result = lm.diagnose_ctx(
            model, options["effective"].get("ctx_size"), options.get("resolved_ctx_size"), target.ctx_size
        )
        findings.append(Row(f"{model}.ctx_size", ctx_result))
    return health, findings


KEY_ENV = ("LEMONADE_ADMIN_API_KEY", "LEMONADE_API_KEY")


def admin_key(path: Path | None) -> str | None:
    """The key Lemonade's admin API takes: --admin-key-file, else its environment variables; None: none."""
    from rocmdoctor.sensitive import API_KEY_PATTERN, KeyFileError, read_api_key, register_secret

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
            register_secret(value)  # never printed, whatever echoes it (a server's version, an error)
            return value
    return None


def lemonade_url(app: App, url: str | None) -> str:
    """--url, else the port of Lemonade's own config on this host (read only), on loopback."""
    from rocmdoctor.provision.server.lemonade_api import CONFIG_FILES, DEFAULT_PORT
    from rocmdoctor.provision.verify.openai_client import normalize_url

    if url:
        from rocmdoctor.sensitive import register_url

        register_url(url)  # the userinfo's password is a secret of this run: never printed
    else:
        port = DEFAULT_PORT
        host = app.host()
        for path in CONFIG_FILES:  # read only: never written under a running server
            read = host.read_text(path, limit=1 << 20)
            if not read.ok:
                continue
            try:
                doc = load_value(read.value.encode("utf-8", "surrogateescape"), path, 1 << 20)
            except DocumentError:
                continue
            port_value = doc.get("port") if isinstance(doc, dict) else None
            if type(port_value) is int and 0 < port_value < 65536:  # a bool is no port
                port = port_value
        url = f"http://127.0.0.1:{port}"
    try:
        return normalize_url(url).removesuffix("/api")
    except ValueError as exc:
        raise UserError(f"--url: {exc}") from None
