"""Lemonade Server as a target: the options rocmdoctor computes for a vLLM model, saved through Lemonade's
options API (provision.lemonade_api), and what is wrong with the ones it has.

Everything here follows Lemonade's own documents, lemonade-sdk/lemonade @
e385039ed33551de7f54cb73194cd08088772c08 (cited below by path):
- docs/api/lemonade.md: `GET/POST/DELETE /v1/models/{id}/options` (POST merges into the saved entry,
  `null` deletes a key, `dry_run: true` validates and resolves without saving, 400 on an unknown or
  wrong-recipe key); `GET /v1/health` (`all_models_loaded[]` with `pid`, `recipe_options`,
  `launch_command`, `backend_url`); `POST /v1/install`; `POST /v1/load`; `GET /v1/system-info`
  (`recipes.vllm.backends.rocm.state|version`). Every path is served under /api/v1 too
  (docs/dev/getting-started.md, "Client-Server Communication").
- docs/dev/getting-started.md, "Internal Endpoints": `GET /internal/config` (the runtime config) behind
  the admin key; docs/guide/configuration/README.md: `global_timeout` (default 600 s, "HTTP, inference,
  and readiness checks"), `LEMONADE_ADMIN_API_KEY` / `LEMONADE_API_KEY` as Bearer tokens.
- docs/guide/configuration/vllm.md: the protected flags (also src/cpp/server/backends/vllm/
  vllm_arg_resolver.cpp `protected_flags()`), `backend_url` for vLLM's own /metrics, the cold-load
  times, the orphaned `VLLM::EngineCore` after a Lemonade-level timeout.
- src/cpp/server/backends/vllm/vllm_arg_resolver.cpp `conflict_key()`: `--gpu-memory-utilization` and
  `--kv-cache-memory-bytes` are one setting (the memory budget); vllm_server.cpp adds
  `--kv-cache-memory-bytes 4G` on non-HBM GPUs unless the user gives one of the two.

Nothing here writes Lemonade's files: every change goes through the running server's API.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rocmdoctor.facts.manifest import parse_release_tag
from rocmdoctor.host_writes import HostWriter
from rocmdoctor.model import Change, Result, failed, passed, warned
from rocmdoctor.provision.bundle.ask_vllm import reviewed_version
from rocmdoctor.provision.server.args import ArgumentError
from rocmdoctor.provision.server.lemonade_api import VLLM_RECIPE, Lemonade, LemonadeError
from rocmdoctor.provision.server.lemonade_args import (
    flag_values,
    merge_vllm_args,
    parse_args,
    split_args,
)
from rocmdoctor.vllm.surface import Surface, for_version, judge_all, judge_flag

# Cold first loads on gfx1151 (docs/guide/configuration/vllm.md "Known gotchas"): FP8 took about
# 12 minutes (TritonFp8BlockScaledMMKernel autotuning); other loads "20 s - several minutes".
COLD_LOAD_S = {"fp8": 12 * 60, "other": 5 * 60}
# global_timeout to ask for: the cold load with half again as margin, in whole minutes.
TIMEOUT_MARGIN = 1.5


@dataclass
class ModelTarget:
    """What rocmdoctor computed for one Lemonade model, each value with its reason."""

    model: str
    ctx_size: int | None
    flags: dict[str, str]
    reasons: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def backend_version(info: Mapping[str, Any], backend: str = "rocm") -> str | None:
    """`recipes.vllm.backends.<backend>.version` of GET /api/v1/system-info (the backend's release tag)."""
    recipes = info.get("recipes")
    entry: Any = None
    if isinstance(recipes, dict) and isinstance(recipes.get(VLLM_RECIPE), dict):
        backends = recipes[VLLM_RECIPE].get("backends")
        entry = backends.get(backend) if isinstance(backends, dict) else None
    version = entry.get("version") if isinstance(entry, dict) else None
    return version if isinstance(version, str) and version else None


def lemonade_vllm(client: Lemonade, backend: str = "rocm") -> Surface:
    """The vLLM Lemonade's vllm-server runs: the shipped table of the version its backend's release tag
    names (system-info), else of the version the reviewed bundles carry; the source says which. Lemonade
    installs its own backend, so no record of rocmdoctor's can be asked."""
    try:
        tag_text = backend_version(client.system_info(), backend)
    except LemonadeError:
        tag_text = None
    tag = parse_release_tag(tag_text) if tag_text else None
    if tag is not None:
        table = for_version(tag.version.base_version)
        why = f"the version Lemonade's vllm:{backend} backend reports ({tag_text})"
    else:
        table = for_version(reviewed_version())
        why = f"Lemonade did not name its vllm:{backend} version ({tag_text or 'none given'}): the reviewed bundles'"
    return replace(table, source=f"{table.source}; {why}")


def judged(target: ModelTarget, vllm: Surface, saved_args: str = "") -> ModelTarget:
    """`target` for the vLLM Lemonade runs: a renamed flag translated with a note, a deprecated one
    noted, one that vLLM lacks refused naming the version (ArgumentError, nothing sent). The flags the
    user saved in vllm_args are kept as written; one that vLLM lacks gets a note (it would refuse it)."""
    judged_flags = judge_all(vllm, target.flags, judge_flag)
    if judged_flags.refusals:
        raise ArgumentError(
            f"{target.model}: " + "; ".join(judged_flags.refusals) + " (nothing was sent to Lemonade)"
        )
    flags, notes = judged_flags.kept, [*target.notes, *judged_flags.notes]
    reasons = {judged_flags.written_as[f]: target.reasons[f] for f in target.flags if f in target.reasons}
    for name, _ in parse_args(split_args(saved_args)):
        said = judge_flag(vllm, name) if name is not None and name not in flags else None
        if said is not None and (said.refusal or said.note):
            notes.append(f"the saved vllm_args of {target.model} carry {name}: {said.refusal or said.note}")
    reasons.update({k: v for k, v in target.reasons.items() if k not in target.flags})
    return replace(target, flags=flags, reasons=reasons, notes=notes)


def options_body(saved: Mapping[str, Any], target: ModelTarget) -> tuple[dict[str, Any], list[str]]:
    """The POST body that brings `saved` to the target: only the keys that change (the endpoint merges,
    so every other saved key stays)."""
    body: dict[str, Any] = {}
    if target.ctx_size is not None and saved.get("ctx_size") != target.ctx_size:
        body["ctx_size"] = target.ctx_size
    current = saved.get("vllm_args")
    current = current if isinstance(current, str) else ""
    merged, notes = merge_vllm_args(current, target.flags)
    if merged != current:
        body["vllm_args"] = merged
    return body, notes


def saved_diff(model: str, before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    def lines(doc: Mapping[str, Any]) -> list[str]:
        return json.dumps(dict(doc), indent=2, sort_keys=True).splitlines(keepends=True)

    return "".join(
        difflib.unified_diff(
            lines(before), lines(after), f"{model} options (saved)", f"{model} options (after)", n=1
        )
    )


def apply_options(
    writer: HostWriter, client: Lemonade, target: ModelTarget, vllm: Surface | None = None
) -> Change:
    """Bring one model's saved options to the target through the options API, a change recorded on the
    command's writer, its flags judged for the vLLM Lemonade runs (`vllm`, default lemonade_vllm). In
    the writer's check mode: Lemonade's own dry run, which validates and resolves, nothing saved. A
    second run sends nothing."""
    current = client.options(target.model)
    if current.get("recipe") not in ("", None, VLLM_RECIPE):
        raise LemonadeError(
            "rejected",
            f"{target.model} uses the {current.get('recipe')!r} recipe, not vllm; rocmdoctor tunes vLLM models",
        )
    saved = current["saved"]
    vllm = vllm if vllm is not None else lemonade_vllm(client)
    saved_args = saved.get("vllm_args") if isinstance(saved.get("vllm_args"), str) else ""
    target = judged(target, vllm, saved_args)
    body, notes = options_body(saved, target)
    data: dict[str, Any] = {
        "model": target.model,
        "target": {"ctx_size": target.ctx_size, "vllm_args": dict(target.flags)},
        "reasons": dict(target.reasons),
        "notes": list(target.notes) + notes,
        "sent": dict(body),
        "dry_run": writer.check_mode,
        "vllm": vllm.described(),
    }
    if not body:
        return Change(False, f"{target.model}: the saved options already match", "", data)
    after = dict(saved) | body
    saving = writer.change("lemonade options", target.model)
    answer = (
        client.save_options(target.model, body) if saving else client.validate_options(target.model, body)
    )
    data["effective"] = answer.get("effective")
    data["resolved_ctx_size"] = answer.get("resolved_ctx_size")
    if saving:
        data["saved"] = answer["saved"]
        missing = {k: v for k, v in body.items() if answer["saved"].get(k) != v}
        if missing:
            raise LemonadeError(
                "shape", f"{target.model}: Lemonade answered 200 but did not save {sorted(missing)}"
            )
    return Change(
        True,
        f"{target.model}: {writer.past('saved', 'save')} {', '.join(sorted(body))}",
        saved_diff(target.model, saved, after),
        data,
    )


def apply_timeout(writer: HostWriter, client: Lemonade, checkpoints: Iterable[str]) -> Change:
    """Raise `global_timeout` to cover the slowest expected cold load (never lower it), through
    POST /internal/set (admin key; docs/dev/getting-started.md), a change recorded on the writer. In its
    check mode nothing is sent: /internal/set has no dry run."""
    config = client.config()
    now = config.get("global_timeout")
    cold_s, why = max((expected_cold_load_s(c) for c in checkpoints), default=expected_cold_load_s(""))
    wanted = wanted_timeout_s(cold_s)
    data = {"global_timeout": now, "wanted": wanted, "why": why}
    if isinstance(now, (int, float)) and not isinstance(now, bool) and now >= wanted:
        return Change(False, f"global_timeout {now:g} s covers the cold load", "", data)
    diff = f"-global_timeout: {now}\n+global_timeout: {wanted}\n"
    if not writer.change("lemonade config", "global_timeout"):
        return Change(True, f"{writer.past('set')} global_timeout {wanted} s ({why})", diff, data)
    client.set_config({"global_timeout": wanted})
    after = client.config().get("global_timeout")
    if after != wanted:
        raise LemonadeError("shape", f"POST /internal/set answered success but global_timeout is {after!r}")
    return Change(True, f"set global_timeout {wanted} s ({why})", diff, data)


# The diagnosis: each a Result (model.py) with a remedy, never printed here.
def expected_cold_load_s(checkpoint: str, model_config: Mapping[str, Any] | None = None) -> tuple[int, str]:
    quant = ""
    if model_config and isinstance(model_config.get("quantization_config"), dict):
        quant = str(model_config["quantization_config"].get("quant_method", ""))
    if "fp8" in checkpoint.lower() or quant.lower() == "fp8":
        return COLD_LOAD_S["fp8"], "an FP8 checkpoint: about 12 minutes cold on gfx1151 (Lemonade's vllm.md)"
    return COLD_LOAD_S[
        "other"
    ], "a cold first load with Triton JIT: up to several minutes (Lemonade's vllm.md)"


def wanted_timeout_s(cold_s: int) -> int:
    return int(math.ceil(cold_s * TIMEOUT_MARGIN / 60) * 60)


def diagnose_timeout(config: Mapping[str, Any], checkpoints: Iterable[str]) -> Result:
    timeout = config.get("global_timeout")
    worst = max((expected_cold_load_s(c) for c in checkpoints), default=expected_cold_load_s(""))
    wanted = wanted_timeout_s(worst[0])
    remedy = f'`lemonade config set global_timeout={wanted}` (or POST /internal/set {{"global_timeout": {wanted}}})'
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        return warned("global_timeout is not in Lemonade's config", remedy, expected_cold_load_s=worst[0])
    if timeout <= 0:
        return failed(
            f"global_timeout is {timeout}: every load fails or is abandoned at once, and vLLM's EngineCore is "
            "left holding the GPU",
            remedy,
            global_timeout=timeout,
        )
    if timeout < worst[0]:
        return failed(
            f"global_timeout {timeout:g} s is shorter than the expected cold load ({worst[1]}): the first load "
            "times out and leaves an orphaned EngineCore",
            remedy,
            global_timeout=timeout,
            expected_cold_load_s=worst[0],
        )
    if timeout < wanted:
        return warned(
            f"global_timeout {timeout:g} s leaves little margin over the expected cold load ({worst[1]})",
            remedy,
            global_timeout=timeout,
            expected_cold_load_s=worst[0],
        )
    return passed(
        f"global_timeout {timeout:g} s covers the expected cold load ({worst[0]} s)", global_timeout=timeout
    )


def orphaned_engines(
    processes: Iterable[Mapping[str, Any]], backend_pids: Iterable[int]
) -> list[dict[str, Any]]:
    """vLLM processes that belong to no model Lemonade has loaded (their backend pid and its children)."""
    owned = set(backend_pids)
    vllm = [p for p in processes if p.get("vllm")]
    by_pid = {p.get("pid"): p for p in processes}

    def owned_by_lemonade(proc: Mapping[str, Any]) -> bool:
        seen = 0
        while proc is not None and seen < 64:
            if proc.get("pid") in owned:
                return True
            proc = by_pid.get(proc.get("ppid"))  # type: ignore[assignment]
            seen += 1
        return False

    return [dict(p) for p in vllm if not owned_by_lemonade(p)]


def diagnose_orphans(processes: list[Mapping[str, Any]], backend_pids: list[int]) -> Result:
    orphans = orphaned_engines(processes, backend_pids)
    if orphans:
        pids = " ".join(str(p["pid"]) for p in orphans)
        return failed(
            f"{len(orphans)} vLLM process(es) no Lemonade model owns (an EngineCore left by a timed-out load "
            f"holds GPU memory): {pids}",
            f"`kill {pids}`, then `kill -9` what remains, before the next load",
            orphans=orphans,
        )
    return passed("no orphaned vLLM EngineCore", backend_pids=backend_pids)


def diagnose_utilization(
    model: str, vllm_args: str, total: int | None, free: int | None, recommended: float | None
) -> Result:
    from rocmdoctor.vllm.memory_rule import passes, requested_bytes

    values = flag_values(vllm_args)
    util_text = values.get("--gpu-memory-utilization")
    fix = f"rocmdoctor lemonade apply --model {model}"
    if util_text is None:
        if "--kv-cache-memory-bytes" in values:
            return passed(
                f"{model}: the KV cache is sized by --kv-cache-memory-bytes {values['--kv-cache-memory-bytes']}"
            )
        return warned(
            f"{model}: no --gpu-memory-utilization: on this GPU Lemonade caps the KV cache at 4 GB "
            "(--kv-cache-memory-bytes 4G), whatever memory is free",
            fix + (f" (sets --gpu-memory-utilization {recommended:.2f})" if recommended else ""),
        )
    try:
        util = float(util_text)
    except ValueError:
        return failed(f"{model}: --gpu-memory-utilization {util_text!r} is not a number", fix)
    if not total or free is None:
        return warned(
            f"{model}: --gpu-memory-utilization {util:g}; the GPU's free memory cannot be read",
            "rocmdoctor check says why",
        )
    gib = 1 << 30
    if not passes(total, free, util):
        return failed(
            f"{model}: --gpu-memory-utilization {util:g} asks {requested_bytes(total, util) / gib:.2f} GiB but "
            f"only {free / gib:.2f} of {total / gib:.2f} GiB is free: vLLM refuses to start",
            fix + (f" (sets {recommended:.2f})" if recommended else ""),
            utilization=util,
        )
    return passed(
        f"{model}: --gpu-memory-utilization {util:g} passes vLLM's free-memory rule", utilization=util
    )


def diagnose_ctx(model: str, effective_ctx: Any, resolved_ctx: Any, planned: int | None) -> Result:
    if planned is None:
        return warned(
            f"{model}: no memory plan (the model's files are not in the Hugging Face cache here)",
            "download it (`lemonade pull`) and point HF_HUB_CACHE at Lemonade's cache",
        )
    ctx = resolved_ctx if isinstance(resolved_ctx, int) and resolved_ctx > 0 else effective_ctx
    if not isinstance(ctx, int) or ctx <= 0:
        return warned(
            f"{model}: ctx_size is automatic; the plan fits {planned} tokens",
            f"rocmdoctor lemonade apply --model {model}",
        )
    if ctx > planned:
        return failed(
            f"{model}: ctx_size {ctx} does not fit the KV cache; the plan fits {planned}",
            f"rocmdoctor lemonade apply --model {model}",
        )
    return passed(f"{model}: ctx_size {ctx} fits (the plan allows {planned})", ctx_size=ctx, planned=planned)


def effective_vllm_args(config: Mapping[str, Any], options_effective: Mapping[str, Any]) -> str:
    """What reaches vllm-server from the user: the global `vllm.args` (`lemonade config set vllm.args=...`)
    and the model's `vllm_args` after them, which win a conflict (vllm.md, "Argument precedence")."""
    section = config.get("vllm")
    global_args = section.get("args") if isinstance(section, dict) else config.get("vllm_args")
    model_args = options_effective.get("vllm_args")
    parts = [a for a in (global_args, model_args) if isinstance(a, str) and a]
    return " ".join(parts)


def diagnose_backend(
    info: Mapping[str, Any], loaded: Iterable[Mapping[str, Any]], backend: str = "rocm"
) -> Result:
    """`recipes.vllm.backends.<backend>` of GET /api/v1/system-info, and where its vllm-server lives (the
    program of a loaded model's `launch_command`)."""
    recipes = info.get("recipes")
    entry = None
    if isinstance(recipes, dict) and isinstance(recipes.get(VLLM_RECIPE), dict):
        backends = recipes[VLLM_RECIPE].get("backends")
        entry = backends.get(backend) if isinstance(backends, dict) else None
    if not isinstance(entry, dict):
        return warned(
            f"Lemonade lists no vllm:{backend} backend",
            "upgrade Lemonade (vLLM arrived as an experimental backend)",
        )
    state, version = entry.get("state"), entry.get("version")
    if state != "installed":
        action = entry.get("action") if isinstance(entry.get("action"), str) else ""
        message = entry.get("message") if isinstance(entry.get("message"), str) else ""
        return failed(
            f"vllm:{backend} is {state}" + (f": {message}" if message else ""),
            action or "rocmdoctor lemonade install-backend",
            state=state,
        )
    programs = [
        m["launch_command"][0]
        for m in loaded
        if isinstance(m.get("launch_command"), list)
        and m["launch_command"]
        and isinstance(m["launch_command"][0], str)
    ]
    where = f" at {programs[0]}" if programs else ""
    details: dict[str, Any] = {"state": state, "version": version}
    if programs:
        details["executable"] = programs[0]
    return passed(f"vllm:{backend} installed ({version or 'version not given'}){where}", **details)


# Lemonade's telemetry reads these vLLM gauges (vllm_server.cpp parse_vllm_metrics_text); vLLM's V1 engine
# exports its KV-cache use as vllm:kv_cache_usage_perc (vllm/v1/metrics/loggers.py) instead.
LEMONADE_READS_KV = "vllm:gpu_cache_usage_factor"
VLLM_KV_USAGE = "vllm:kv_cache_usage_perc"


def diagnose_launch(launch_command: Any, saved: Mapping[str, Any]) -> Result:
    """Whether the running vllm-server got the saved options (a model loaded before they were saved
    keeps its old ones until its next load: Lemonade's options doc)."""
    if not isinstance(launch_command, list) or not all(isinstance(w, str) for w in launch_command):
        return warned("/api/v1/health gives no launch_command for the model", "upgrade Lemonade")
    running = flag_values(" ".join(launch_command))
    wanted = flag_values(saved.get("vllm_args") or "") if isinstance(saved.get("vllm_args"), str) else {}
    if isinstance(saved.get("ctx_size"), int) and saved["ctx_size"] > 0:
        wanted["--max-model-len"] = str(saved["ctx_size"])
    stale = {flag: (value, running.get(flag)) for flag, value in wanted.items() if running.get(flag) != value}
    if stale:
        said = ", ".join(f"{flag} {got or '(none)'} (saved: {value})" for flag, (value, got) in stale.items())
        return warned(
            f"the running vLLM has {said}: it was loaded before the options were saved",
            "unload it (`lemonade unload`) and run `rocmdoctor lemonade verify` again",
            stale=sorted(stale),
        )
    return passed("the running vLLM got the saved options", flags=sorted(wanted))


def diagnose_telemetry(metric_names: Iterable[str]) -> Result:
    names = set(metric_names)
    if VLLM_KV_USAGE in names and LEMONADE_READS_KV not in names:
        return warned(
            f"Lemonade's telemetry reads {LEMONADE_READS_KV}, which this vLLM does not export: its KV-cache "
            "figure stays empty",
            f"watch {VLLM_KV_USAGE} at the backend_url's /metrics (rocmdoctor plan --url BACKEND diagnoses it)",
        )
    return passed("vLLM's /metrics has the gauges Lemonade reads")
