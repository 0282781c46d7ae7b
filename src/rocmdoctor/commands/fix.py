"""`rocmdoctor fix`: apply the safe remedies of the diagnosis (provision/fix.py), print the rest as
`fix-kernel` does, and verify afterwards by diagnosing again."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import click

from rocmdoctor import params
from rocmdoctor.commands.check_context import check_context, choose_gpus
from rocmdoctor.commands.common import App, UserError, emit_change, pass_app
from rocmdoctor.commands.server_options import server_option
from rocmdoctor.facts import remedies
from rocmdoctor.registry import DEFAULT_PREFIX
from rocmdoctor.textnum import is_decimal

# Checks whose findings the fix answers (fix-kernel's, and the access, process and multi-GPU ones).
DIAGNOSED = ("kernel.version", "kernel.cwsr", "driver.dkms", "memory.ttm", "access.devices", "env.multi_gpu")
# The fix-kernel steps `fix` applies itself; the others stay printed.
APPLIED_STEPS = ("ttm", "gttsize", "dkms")
DEVICE_GROUPS = ("render", "video")
OCI_KINDS = ("docker", "podman", "kubernetes", "oci")


def _diagnose(ctx: Any) -> dict[str, Any]:
    from rocmdoctor.checks import load_registry
    from rocmdoctor.checks.kernel_guidance import Finding

    registry = load_registry()
    outcomes = registry.run(ctx, registry.select(only=list(DIAGNOSED)))
    return {
        o.spec.id: Finding(o.result.status.value, o.result.summary, o.result.details, o.result.remedy)
        for o in outcomes
    }


def _orphans(target: Any, user: str) -> tuple[Any, tuple[str, ...]]:
    """Orphaned vLLM engines of the target machine (processes.orphans' rule: a process whose identity
    says vLLM, with PID 1 as its parent), root's or the service user's, each held through a pidfd until
    it is signalled; and a note for each vLLM orphan left alone."""
    from rocmdoctor.host_processes import hold_vllm_orphans

    passwd = target.read_text("/etc/passwd")
    users = {0} | {
        int(f[2])
        for f in (ln.split(":") for ln in (passwd.value if passwd.ok else "").splitlines())
        if len(f) > 2 and f[0] == user and is_decimal(f[2])
    }
    held, notes = hold_vllm_orphans(users)
    return tuple(held), tuple(notes)


def check_context_for(host: Any) -> Any:
    from rocmdoctor.registry import Context, Options

    return Context(host, Options(prefix=DEFAULT_PREFIX))


def _device_nodes_need_udev(ctx: Any, findings: dict[str, Any]) -> bool:
    """A KFD or render node of the diagnosed host that is not its group render with mode 0660. Inside a
    container udev does not manage the nodes passed in: the plan refuses the rule there and prints the
    host's change instead (Wanted.host_only, from the container detection itself)."""
    from rocmdoctor.checks.access import groups_table
    from rocmdoctor.checks.driver import DEV_KFD, render_nodes

    render_gid = next((gid for gid, (name, _) in groups_table(ctx).items() if name == "render"), None)
    if render_gid is None:
        return False
    nodes = [st for st in (ctx.host.stat(p) for p in [DEV_KFD, *render_nodes(ctx)]) if st is not None]
    return any(st.gid != render_gid or st.mode & 0o060 != 0o060 for st in nodes)


def wanted_from(ctx: Any, findings: dict[str, Any], distro: dict[str, Any], target: Any, user: str) -> Any:
    """What the diagnosis asks for, as provision's plain Wanted (the one place checks meet provision here)."""
    from rocmdoctor.checks.facts import kernel_release, meminfo
    from rocmdoctor.checks.kernel_guidance import distro_family, ttm_steps
    from rocmdoctor.facts.next_boot import TOOL_PATHS
    from rocmdoctor.provision.fix import Wanted

    family = distro_family(distro.get("id"), distro.get("like"))
    groups_text = target.read_text("/etc/group")
    if not groups_text.ok and groups_text.state.value in ("denied", "unreadable"):
        raise UserError(
            f"cannot read /etc/group of {target.root} ({groups_text.describe()}): run fix as root"
        )
    table = {
        f[0]: f[2]
        for f in (ln.split(":") for ln in (groups_text.value if groups_text.ok else "").splitlines())
        if len(f) > 2
    }
    dkms = findings.get("driver.dkms")
    removing_dkms = bool(dkms and dkms.status == "fail" and not dkms.details.get("instinct"))
    steps = {s.id: s for s in ttm_steps(family, findings.get("memory.ttm"), removing_dkms)}
    ttm_pages, modules = None, ("ttm",)
    if "ttm" in steps:
        pairs = re.findall(r"options (\w+) pages_limit=(\d+)", " ".join(steps["ttm"].commands))
        if pairs:
            modules = tuple(m for m, _ in pairs)
            ttm_pages = int(pairs[0][1])
    orphans, orphans_left = _orphans(target, user) if target.is_live else ((), ())
    multi = findings.get("env.multi_gpu")
    iommu = bool(multi and any("no iommu=pt" in f["finding"] for f in multi.details.get("findings", [])))
    from rocmdoctor.checks.container import detect

    access = findings.get("access.devices")
    found = detect(ctx)
    container = found.to_json() if found is not None else {}
    # In an OCI container the nodes' gid comes from the host's `run`: access.devices names --group-add.
    gpu_found = access is not None and access.status != "skip" and container.get("kind") not in OCI_KINDS
    return Wanted(
        user=user,
        family=family,
        # never a group whose gid is 0 (group root): provision's groups_item refuses it too
        groups=tuple(g for g in DEVICE_GROUPS if g in table and table[g].strip() != "0") if gpu_found else (),
        ttm_pages=ttm_pages,
        ttm_modules=modules,
        cmdline_add=("iommu=pt",) if iommu else (),
        cmdline_remove=("amdgpu.gttsize",) if "gttsize" in steps else (),
        udev=_device_nodes_need_udev(ctx, findings),
        orphans=orphans,
        orphans_left=orphans_left,
        dkms_remove=removing_dkms,
        tools=tuple(name for name, paths in TOOL_PATHS.items() if any(target.exists(p) for p in paths)),
        kernel=kernel_release(ctx),
        ram_bytes=meminfo(ctx).get("MemTotal"),
        depends="carveout" if "carveout" in steps else "",
        host_only=host_side(ctx, container),
    )


def host_side(ctx: Any, container: dict[str, Any]) -> str:
    """Inside a container, what to change on the host instead (its runtime's own words, with the nodes'
    device numbers); "" outside one."""
    from rocmdoctor.checks.access import user_namespace
    from rocmdoctor.checks.container import host_side_change
    from rocmdoctor.checks.driver import DEV_KFD, render_nodes

    if not container:
        return ""
    nodes = [st for st in (ctx.host.stat(p) for p in [DEV_KFD, *render_nodes(ctx)]) if st is not None]
    details = {"devices": {st.path: st.to_json() for st in nodes}, "user_namespace": user_namespace(ctx)}
    return host_side_change(container.get("kind", ""), details)


def _unapplied(distro: dict[str, Any], kernel: str | None, findings: dict[str, Any]) -> list[dict[str, Any]]:
    from rocmdoctor.checks.kernel_guidance import guidance

    document = guidance(distro, kernel, findings)
    return [s for s in document["steps"] if s["id"] not in APPLIED_STEPS]


def _print(items: list[Any], unapplied: list[dict[str, Any]], show_diff: bool, notes: list[str]) -> None:
    for note in notes:
        click.echo(f"note: {note}")
    for item in items:
        mark = "refused" if item.refused else ("change" if item.changes else "ok")
        click.echo(f"[{mark}] {item.id}: {item.title}")
        if item.note:
            click.echo(f"    note: {item.note}")
        if item.refused:
            click.echo(f"    cannot apply here: {item.refused}")
        elif item.changes:
            if show_diff:
                for line in item.diff().rstrip("\n").splitlines():
                    click.echo(f"    {line}")
            if item.before_check:
                click.echo(f"    before its check passes: {item.before_check}")
            if item.cannot_undo:
                click.echo(f"    cannot be undone: {item.cannot_undo}")
    for number, step in enumerate(unapplied, 1):
        click.echo(f"\nnot applied by fix ({number}). {step['title']}\n   why: {step['why']}\n   run:")
        for command in step["commands"]:
            click.echo(f"     {command}")
        click.echo("   verify after the reboot:")
        for command in step["verify"]:
            click.echo(f"     {command}")


@click.command("fix")
@click.option(
    "--check", "check_only", is_flag=True, help="Show what would change (with its diff); write nothing."
)
@click.option("--diff", "show_diff", is_flag=True, help="Show each change's diff.")
@click.option(
    "--only",
    multiple=True,
    type=click.Choice(remedies.choices()),
    help="Apply only these remedies: a remedy, a part of one (cmdline.iommu) or the check it answers (repeatable).",
)
@click.option("--yes", is_flag=True, help="Apply without asking.")
@click.option(
    "--target",
    type=params.NonEmptyPath(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Apply inside this image tree (files and accounts only) instead of the host diagnosed.",
)
@click.option(
    "--user",
    default="vllm",
    show_default=True,
    type=params.ServiceUser(),
    help="The service user to fix for.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the change envelope as JSON on stdout.")
@server_option("gpu", help="The GPUs vLLM will serve, as for check (PCI slot or node:N; repeatable).")
@pass_app
def fix(
    app: App,
    check_only: bool,
    show_diff: bool,
    only: tuple[str, ...],
    yes: bool,
    target: Path | None,
    user: str,
    as_json: bool,
    gpus: tuple[str, ...] = (),
) -> None:
    """Apply the safe remedies the diagnosis found (group membership, the TTM modprobe file, the kernel
    command line, a udev rule, orphaned vLLM engines, a shadowing DKMS driver), then verify.
    Steps it cannot apply are printed as `fix-kernel` prints them."""
    from rocmdoctor.checks.facts import distro_info, kernel_release
    from rocmdoctor.host import Host
    from rocmdoctor.host_writes import HostWriter, is_live
    from rocmdoctor.provision.fix import FixError, apply, change, plan

    ctx = check_context(app, user, 8000, DEFAULT_PREFIX)
    choose_gpus(ctx, gpus)
    notes: list[str] = []
    target_root = target if target is not None else Path(app.root)
    if target is None and not is_live(Path(app.root)):
        check_only = True
        notes.append(
            f"--root {app.root} is a replayed tree: nothing is written (--target DIR applies inside one)"
        )
    findings = _diagnose(ctx)
    distro = distro_info(ctx)
    present = findings.get("gpu.present")
    if present is not None and present.status != "pass":
        notes.append(f"no AMD GPU to fix for: {present.summary}")
    target_host = Host(target_root)
    writer = HostWriter(target_root, check_mode=check_only)
    items = plan(writer, wanted_from(ctx, findings, distro, target_host, user), only)
    unapplied = [] if only else _unapplied(distro, kernel_release(ctx), findings)
    pending = [i for i in items if i.changes and not i.refused]
    if not as_json:
        _print(items, unapplied, show_diff or check_only, notes)
    if pending and not check_only:
        if not yes:
            if not sys.stdin.isatty():
                raise UserError("fix changes the host: confirm with --yes (or look first with --check)")
            click.confirm(f"Apply {len(pending)} change(s) to {target_root}?", abort=True, err=True)
        try:
            apply(writer, items)
        except FixError as exc:
            raise UserError(f"could not apply {exc}") from None
        verify = _verify(app, target_root, user, only, items, gpus)
    else:
        verify = []
    result = change(writer, items, notes)
    rows = [
        f"verify {row['id']}: {row['state']}" + (f" ({row['note']})" if row["note"] else "") for row in verify
    ]
    # the diff was shown with the plan, before the confirmation
    emit_change(result, as_json, rows, with_diff=False, verify=verify, unapplied=unapplied)


def _verify(
    app: App, target_root: Path, user: str, only: tuple[str, ...], applied: list[Any], gpus: tuple[str, ...]
) -> list[dict]:
    """Diagnose again (a fresh read of the host and the target) and plan again: an applied item must now
    have nothing left to change; its check passes once what `before_check` names has happened."""
    from rocmdoctor.checks.facts import distro_info
    from rocmdoctor.host import Host
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.provision.fix import plan

    ctx = check_context(app, user, 8000, DEFAULT_PREFIX)
    ctx.options.gpus = gpus
    findings = _diagnose(ctx)
    again = {
        i.id: i
        for i in plan(
            HostWriter(target_root),
            wanted_from(ctx, findings, distro_info(ctx), Host(target_root), user),
            only,
        )
    }
    rows = []
    for item in applied:
        if item.refused or not item.changes:
            continue
        left = again.get(item.id)
        if left is None or not left.changes:
            rows.append({"id": item.id, "state": "ok", "note": item.before_check})
        else:
            rows.append(
                {"id": item.id, "state": "still pending", "note": left.refused or left.diff().strip()[:200]}
            )
    return rows
