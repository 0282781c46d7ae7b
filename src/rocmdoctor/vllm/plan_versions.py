"""The plan's rules that differ by the vLLM version that will serve, each with the file it was read from.

One table, one row per vLLM version the reviewed bundles carry (bundles/manifest.toml: 0.19.1 for
gfx942, 0.20.1 for the RDNA families, 0.22.1 stable and 0.25.1 nightly channels) and the 0.32 engine
the tests run. Every row was read from that version's own sources (`vllm/v1/kv_cache_interface.py`,
`vllm/v1/core/kv_cache_utils.py`, `vllm/config/vllm.py`, `vllm/model_executor/models/config.py`);
whatever is not a column here is the same in every row (the grouping of
`_get_kv_cache_groups_uniform_page_size`, `get_num_blocks`, async scheduling on by default in
`VllmConfig.__post_init__`, `get_max_concurrency_for_kv_cache_config` on one page size).
A layout the table marks as not modelled for a version is refused, never planned with 0.32's rules.
"""

from __future__ import annotations

from dataclasses import dataclass

from rocmdoctor.vllm.layers import ConfigError


@dataclass(frozen=True, slots=True)
class VersionRules:
    version: str
    # Sliding-window and chunked-local layers keep their window plus the tokens in flight: every batch in
    # flight (`VllmConfig.max_in_flight_tokens`, 2 with async scheduling) or one max_num_batched_tokens.
    local_keeps_every_batch: bool
    # The start-up check holds back the null block (`get_kv_cache_configs` checks memory less one block).
    check_reserves_null_block: bool
    # The log line's token figure: int(concurrency x max_model_len) (`get_kv_cache_capacity`), or
    # num_blocks // groups x the smallest block size (0.19.1 `_report_kv_cache_config`).
    tokens_from_concurrency: bool
    # Recurrent-state layers: 0.32 is "align" with prefix caching (2 blocks + prefill checkpoints);
    # older versions pick "all" (a block per block_size tokens) for the architectures that implement
    # SupportsMambaPrefixCaching, a per-model list the plan does not carry, and their hybrid block
    # alignment was not read: state layers are planned at 0.32 only.
    state_layers: bool
    # Layers of different page sizes (`unify_kv_cache_spec_page_size`, UniformTypeKVCacheSpecs): 0.32
    # pads a non-dividing attention page; 0.20.1 raises, 0.25.1 pads only some backends.
    mixed_pages: bool
    sources: tuple[str, ...]


_OLD = (
    "vllm/v1/kv_cache_interface.py SlidingWindowSpec/ChunkedLocalAttentionSpec.max_memory_usage_bytes: "
    "max_num_batched_tokens, one batch",
    "vllm/v1/core/kv_cache_utils.py get_kv_cache_configs: _check_enough_kv_cache_memory(available_memory) "
    "without the null block",
    "vllm/model_executor/models/config.py MambaModelConfig: mamba_cache_mode 'all' where "
    "supports_mamba_prefix_caching",
)

RULES: dict[str, VersionRules] = {
    "0.19.1": VersionRules(
        "0.19.1",
        local_keeps_every_batch=False,
        check_reserves_null_block=False,
        tokens_from_concurrency=False,
        state_layers=False,
        mixed_pages=False,
        sources=(
            *_OLD,
            "vllm/v1/core/kv_cache_utils.py _report_kv_cache_config: "
            "num_blocks // len(groups) x min block size",
        ),
    ),
    "0.20.1": VersionRules(
        "0.20.1",
        local_keeps_every_batch=False,
        check_reserves_null_block=False,
        tokens_from_concurrency=True,
        state_layers=False,
        mixed_pages=False,
        sources=(
            *_OLD,
            "vllm/v1/core/kv_cache_utils.py unify_kv_cache_spec_page_size: raises on a non-dividing page",
        ),
    ),
    "0.22.1": VersionRules(
        "0.22.1",
        local_keeps_every_batch=False,
        check_reserves_null_block=False,
        tokens_from_concurrency=True,
        state_layers=False,
        mixed_pages=False,
        sources=_OLD,
    ),
    "0.25.1": VersionRules(
        "0.25.1",
        local_keeps_every_batch=False,
        check_reserves_null_block=False,
        tokens_from_concurrency=True,
        state_layers=False,
        mixed_pages=False,
        sources=(
            *_OLD,
            "vllm/v1/core/kv_cache_utils.py unify_kv_cache_spec_page_size: pads only "
            "indexes_kv_by_block_stride backends",
        ),
    ),
    "0.32.0": VersionRules(
        "0.32.0",
        local_keeps_every_batch=True,
        check_reserves_null_block=True,
        tokens_from_concurrency=True,
        state_layers=True,
        mixed_pages=True,
        sources=(
            "vllm/v1/kv_cache_interface.py SlidingWindowSpec/ChunkedLocalAttentionSpec: "
            "VllmConfig.max_in_flight_tokens (vllm/config/vllm.py)",
            "vllm/v1/core/kv_cache_utils.py get_kv_cache_configs: available_memory - _pool_bytes_per_block",
            "vllm/v1/core/kv_cache_utils.py get_kv_cache_capacity: int(concurrency x max_model_len)",
            "vllm/model_executor/models/config.py MambaModelConfig: 'align' with prefix caching",
        ),
    ),
}
KNOWN_VERSIONS = tuple(RULES)
DEFAULT_VERSION = "0.32.0"


def release_of(version: str) -> str | None:
    """The table's key for a vLLM version string: its release (a bundle's local part, `+rocm...`, names
    the build, not other sources); None for a dev or pre-release, whose sources no row was read from."""
    from packaging.version import InvalidVersion, Version

    try:
        parsed = Version(version)
    except InvalidVersion:
        return None
    if parsed.is_devrelease or parsed.is_prerelease:
        return None
    key = ".".join(str(n) for n in (*parsed.release, 0, 0)[:3])
    return key if key in RULES else None


def shown(version: str) -> str:
    """A version as reports print it: a bundle's dist-info is the bundle's text, so at most 40 printable
    characters, else its repr cut there."""
    if len(version) <= 40 and version.isprintable():
        return version
    return repr(version[:40]) + "..."


def rules_for(version: str) -> VersionRules:
    key = release_of(version)
    if key is None:
        raise ConfigError(
            f"cannot plan exactly for vLLM {shown(version)}: rocmdoctor knows the KV-cache rules of vLLM "
            f"{', '.join(KNOWN_VERSIONS)} only"
        )
    return RULES[key]
