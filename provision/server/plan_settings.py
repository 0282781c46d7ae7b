"""What `unit` and `serve` take from the plan: --max-model-len and --max-num-seqs with their reasons, or a
refusal with the plan's remedies when the layout cannot start.

`server_args.resolve()` calls `settings_from_plan()` once it knows the GPU group and the utilization;
the flags come back as (flag, value, reason) triples, the shape of `server_args.Setting`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rocmdoctor.host import Host
from rocmdoctor.provision.server.hub import load_model
from rocmdoctor.vllm.memory_plan import EngineSettings, Memory, ModelPlan, plan_from_files
from rocmdoctor.vllm.plan_versions import DEFAULT_VERSION, release_of, shown


@dataclass(frozen=True, slots=True)
class ServingVersion:
    """The vLLM whose rules the plan uses, and where that came from (named in the plan's output)."""

    version: str
    source: str


def serving_version(
    host: Host, prefix: str, named: str | None = None, gfx: str | None = None
) -> ServingVersion:
    """The installed bundle's own vLLM (its dist-info, facts/installed_bundle.py); else the version the user
    named; else the version in the reviewed release tag the shipped manifest pins for this host's family
    (release tags are `vllm<version>-rocm<ver>-<family>`, facts/manifest.py); else the newest rules, said so.
    A named version that contradicts the installed bundle's wins, and the source says which is installed."""
    from rocmdoctor.facts.installed_bundle import read_installed
    from rocmdoctor.facts.manifest import parse_release_tag, shipped_manifest

    installed = read_installed(host, prefix)
    where = f"the bundle installed under {installed.prefix}"
    if named is not None:
        also = f"; {where} carries vLLM {shown(installed.vllm_version)}" if installed.vllm_version else ""
        return ServingVersion(named, f"--vllm-version{also}")
    if installed.vllm_version:
        return ServingVersion(installed.vllm_version, f"{where} (its vllm dist-info)")
    manifest = shipped_manifest()
    family = gfx if gfx in manifest.families else manifest.family_for_gfx(gfx)  # a pool names either
    pin = manifest.families.get(family) if family else None
    tag = parse_release_tag(pin.tag) if pin and pin.tag else None
    if tag is not None and tag.product == "vllm" and release_of(str(tag.version)):
        return ServingVersion(
            str(tag.version),
            f"no bundle installed: the reviewed bundle for {family} ({tag.tag}, manifest.toml)",
        )
    why = f"no bundle installed under {installed.prefix}" + (
        f" and no reviewed bundle for {gfx}" if gfx else ""
    )
    return ServingVersion(DEFAULT_VERSION, f"{why}: the newest rules rocmdoctor knows (pass --vllm-version)")


@dataclass
class PlannedSettings:
    plan: ModelPlan
    settings: list[tuple[str, str, str]] = field(default_factory=list)
    refusal: str | None = None  # set: the layout cannot start; the text says why and what to do
    notes: list[str] = field(default_factory=list)


def settings_from_plan(
    plan: ModelPlan,
    *,
    user_max_model_len: int | None,
    user_max_num_seqs: int | None,
    max_num_seqs_cap: int,
) -> PlannedSettings:
    """The computed flags for a plan. `max_num_seqs_cap`: the memory class's own value (10 on a unified APU)."""
    out = PlannedSettings(plan)
    if plan.settings.rules.version != DEFAULT_VERSION:  # the newest rules are the default and say nothing new
        out.notes.append(
            f"sized by vLLM {shown(plan.settings.vllm_version)}'s KV-cache rules ({plan.vllm_version_source})"
        )
    if plan.kv_cache_tokens is None or plan.max_model_len is None:
        out.notes.append(f"no memory plan for the model: {plan.memory_null_reason}")
        return out
    if not plan.max_model_len:
        remedies = "; ".join(f"{r.action} ({r.flag}: {r.figure})" for r in plan.remedies) or "a larger GPU"
        out.refusal = f"{plan.model} cannot start here: {'; '.join(plan.reasons)}. Try: {remedies}"
        return out
    if user_max_model_len is None and not plan.fits:
        out.settings.append(
            (
                "--max-model-len",
                str(plan.max_model_len),
                f"the model's {plan.max_model_len_requested} tokens do not fit in the KV cache "
                f"({plan.kv_cache_bytes or 0} B); {plan.max_model_len} is the longest that does (rocmdoctor plan)",
            )
        )
    elif user_max_model_len is not None and not plan.fits:
        remedies = "; ".join(f"{r.action} ({r.flag})" for r in plan.remedies)
        out.refusal = (
            f"--max-model-len {user_max_model_len} does not fit: {'; '.join(plan.reasons)}. Try: {remedies}"
        )
        return out
    if user_max_num_seqs is None and plan.max_num_seqs:
        seqs = min(plan.max_num_seqs, max_num_seqs_cap)
        out.settings.append(
            (
                "--max-num-seqs",
                str(seqs),
                f"{plan.max_num_seqs} sequences of {plan.typical_len} tokens fit in the KV cache"
                + (
                    f", capped at {max_num_seqs_cap} for this memory class"
                    if seqs < plan.max_num_seqs
                    else ""
                ),
            )
        )
    return out


# vLLM's own flags (vllm/engine/arg_utils.py) that change the plan, as `serve`/`unit` pass them through.
_INT_FLAGS = {
    "--block-size": "block_size",
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "-pp": "pipeline_parallel_size",
}
_BOOL_FLAGS = {
    "--enable-prefix-caching": ("enable_prefix_caching", True),
    "--no-enable-prefix-caching": ("enable_prefix_caching", False),
    "--async-scheduling": ("async_scheduling", True),
    "--no-async-scheduling": ("async_scheduling", False),
}
_DTYPE_FLAGS = {
    "--mamba-cache-dtype": "mamba_cache_dtype",
    "--mamba-ssm-cache-dtype": "mamba_ssm_cache_dtype",
}


def engine_settings(base: EngineSettings, extra: Sequence[str]) -> EngineSettings:
    """`base` with the plan-relevant vLLM flags found in `extra` (`--flag value` or `--flag=value`);
    a value vLLM itself would reject is left to vLLM and not planned with."""
    changes: dict[str, Any] = {}
    words = list(extra)
    for i, word in enumerate(words):
        flag, _, inline = word.partition("=")
        value = inline if inline else (words[i + 1] if i + 1 < len(words) else "")
        if flag in _BOOL_FLAGS and not inline:
            name, on = _BOOL_FLAGS[flag]
            changes[name] = on
        elif flag in _INT_FLAGS and value.isdigit() and int(value) > 0:
            changes[_INT_FLAGS[flag]] = int(value)
        elif flag in _DTYPE_FLAGS and value in ("auto", "float32", "bfloat16", "float16"):
            changes[_DTYPE_FLAGS[flag]] = value
    return replace(base, **changes)


def plan_for_server(
    model: str,
    *,
    total_bytes: int,
    utilization: float,
    pool_name: str,
    tensor_parallel_size: int = 1,
    kv_cache_dtype: str = "auto",
    max_model_len: int | None = None,
    offline: bool = False,
    extra: Sequence[str] = (),
    version: ServingVersion | None = None,
) -> ModelPlan:
    """The plan for the server `unit`/`serve` are about to start (raises ModelFilesError, ConfigError)."""
    files = load_model(model, offline=offline)
    base = EngineSettings(tensor_parallel_size=tensor_parallel_size, kv_cache_dtype=kv_cache_dtype)
    if version is not None:
        base = replace(base, vllm_version=version.version)
    plan = plan_from_files(
        files,
        Memory(total_bytes, utilization, f"host: {pool_name}"),
        settings=engine_settings(base, extra),
        max_model_len=max_model_len,
        model=model,
    )
    if version is not None:
        plan.vllm_version_source = version.source
    return plan
