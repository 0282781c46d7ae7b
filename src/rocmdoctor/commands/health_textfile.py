"""`check --textfile PATH`: the diagnosis, GPU memory, the active bundle and each managed server's
health as one `health_metrics.HealthRun`, written for node_exporter's textfile collector.

Joins the diagnosis (checks) with the servers (provision/server_health), which never import each
other; rendering is `render_textfile`, writing is `atomic.write_atomic` (a temp name in the same
directory, then a rename: the collector never reads half a file, and reads only `*.prom`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rocmdoctor.commands.common import UserError
from rocmdoctor.documents import load_value
from rocmdoctor.registry import Context
from rocmdoctor.vllm.health_metrics import BundleInfo, GpuMemory, HealthRun, ServerHealth

BUNDLE_METADATA = ".rocmdoctor-bundle.json"
METADATA_LIMIT = 1 << 20


def textfile_problem(path: Path) -> str | None:
    """Why rocmdoctor cannot write its textfile at `path`; None when it can."""
    if path.suffix != ".prom":
        return (
            "node_exporter's textfile collector reads only files named *.prom; name it like rocmdoctor.prom"
        )
    if not path.parent.is_dir():
        return (
            f"{path.parent} is not a directory: create it, and point node_exporter's "
            "--collector.textfile.directory at it"
        )
    if path.is_dir():
        return "is a directory; give a file path such as <dir>/rocmdoctor.prom"
    return None


def gpu_memory(ctx: Context) -> list[GpuMemory]:
    from rocmdoctor.checks import facts
    from rocmdoctor.commands.host_devices import host_devices
    from rocmdoctor.provision.server.layout import rocr_indices

    devices = host_devices(ctx)
    index = rocr_indices(devices)
    nodes = {gpu.node: gpu for gpu in facts.gpus(ctx)}
    return [
        GpuMemory(
            kfd_node=d.kfd_node,
            pci_slot=d.pci_slot,
            gpu_id=index.get(d.kfd_node),
            partition=d.partition or 0,
            compute_partition=d.compute_partition,
            vram_total=nodes[d.kfd_node].vram_total if d.kfd_node in nodes else None,
            gtt_total=nodes[d.kfd_node].gtt_total if d.kfd_node in nodes else None,
            memory_total=d.memory_total,
            memory_free=d.memory_free,
        )
        for d in devices
    ]


def ttm_limit_bytes(report: dict[str, Any]) -> int | None:
    """The TTM limit the memory.ttm check read, in bytes (pages of 4 KiB)."""
    for check in report["checks"]:
        if check["id"] == "memory.ttm":
            limits = ((check.get("details") or {}).get("pages_limit")) or {}
            governing = check["details"].get("governing")
            pages = limits.get(governing) if governing else None
            return int(pages) * 4096 if isinstance(pages, int) else None
    return None


def _qualified(tag: str, family: str, meta: dict[str, Any]) -> str:
    """`true` when the bundle was recorded as qualified or is the manifest's reviewed pin for its
    family; `false` when it is another tag of a family that has a reviewed pin; else `unknown`."""
    from rocmdoctor.facts.manifest import parse_manifest
    from rocmdoctor.host_files import shipped_text

    if isinstance(meta.get("qualified"), bool):
        return str(meta["qualified"]).lower()
    pin = parse_manifest(shipped_text("rocmdoctor.bundles", "manifest.toml")).families.get(family)
    if pin is None or pin.tag is None:
        return "unknown"
    return str(pin.tag == tag).lower()


def _bundle_digest(meta: dict[str, Any]) -> str:
    """The archive's digest; for a bundle in parts, the digest of its first part (each part is
    verified on install; the tag names the whole)."""
    assets = meta.get("assets")
    if isinstance(assets, list) and assets and isinstance(assets[0], dict):
        return str(assets[0].get("digest") or "")
    return ""


def active_bundle(ctx: Context) -> BundleInfo | None:
    prefix = ctx.options.prefix.rstrip("/")
    link = ctx.host.readlink(f"{prefix}/current")
    if not link.ok:
        return None
    tag = Path(link.value).name
    raw = ctx.host.read_text(f"{prefix}/bundles/{tag}/{BUNDLE_METADATA}", METADATA_LIMIT)
    try:
        meta = load_value(raw.value, "bundle metadata", METADATA_LIMIT) if raw.ok else {}
    except ValueError:
        meta = {}
    meta = meta if isinstance(meta, dict) else {}
    family = str(meta.get("family") or "")
    return BundleInfo(
        tag=tag, family=family, digest=_bundle_digest(meta), qualified=_qualified(tag, family, meta)
    )


def servers(ctx: Context) -> list[ServerHealth]:
    from rocmdoctor.commands.host_devices import host_devices
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.provision.verify.health import managed_servers, probe

    managed = managed_servers(HostWriter(ctx.host.root))
    if not managed:
        return []
    devices = host_devices(ctx)
    return [probe(server, devices) for server in managed]


def health_run(ctx: Context, report: dict[str, Any], started: float) -> HealthRun:
    from rocmdoctor import __version__

    run = HealthRun(
        version=__version__,
        finished_at=0.0,
        duration_s=0.0,
        checks=[(c["id"], c["status"]) for c in report["checks"]],
        actions={action: list(v["blocking"]) for action, v in report["policy"].items()},
        gpus=gpu_memory(ctx),
        ttm_limit_bytes=ttm_limit_bytes(report),
        bundle=active_bundle(ctx),
        servers=servers(ctx),
    )
    run.finished_at = time.time()
    run.duration_s = time.monotonic() - started
    return run


def write_textfile(path: Path, text: str) -> None:
    from rocmdoctor.atomic import write_atomic

    try:
        write_atomic(path, text, 0o644)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
