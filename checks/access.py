"""Can the user who will run vLLM open /dev/kfd and the render nodes (groups, modes, stale logins, udev's
uaccess ACLs, container gid mappings)?"""

from __future__ import annotations

from dataclasses import dataclass

from rocmdoctor.checks import check
from rocmdoctor.checks.container import ENV as CONTAINER_ENV
from rocmdoctor.checks.container import READS as CONTAINER_READS
from rocmdoctor.checks.container import detect as detect_container
from rocmdoctor.checks.container import run_remedy
from rocmdoctor.checks.driver import DEV_KFD, RENDER_NODES, render_nodes
from rocmdoctor.facts.remedies import fixable
from rocmdoctor.host import StatInfo
from rocmdoctor.model import Result, failed, passed, warned
from rocmdoctor.registry import Context
from rocmdoctor.textnum import is_decimal

PASSWD = "/etc/passwd"
GROUP = "/etc/group"
# udev's database: one file per device number ("c226:128"); "G:"/"Q:" lines are its tags. A node tagged
# `uaccess` gets an ACL for the user of the active local seat from systemd-logind, and loses it at logout.
UDEV_DATA = "/run/udev/data"
UID_MAP = "/proc/self/uid_map"
GID_MAP = "/proc/self/gid_map"
PROC_STATUS = "/proc/[0-9]*/status"
MAX_PROCESSES = 4096  # processes whose groups are compared (the first by PID)
OVERFLOW_GID = "/proc/sys/kernel/overflowgid"
DEFAULT_OVERFLOW_GID = 65534
IDENTITY_MAP = [(0, 0, 4294967295)]
CONTAINER_REMEDY = (
    "Map the host's render group into the container: Proxmox `pct set <id> --dev0 /dev/dri/renderD128,gid=<render "
    "gid inside> --dev1 /dev/kfd,gid=<render gid inside>`; LXD/Incus `lxc config device add <name> gpu gpu "
    "gid=<render gid inside>`; plain LXC: an lxc.idmap entry for the gid, or chgrp the nodes at container start "
    "(`chgrp render /dev/kfd /dev/dri/renderD*; chmod 0660 ...`)"
)


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: str


def parse_colon_file(text: str, fields: int) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= fields and not line.startswith("#"):
            rows.append(parts)
    return rows


def groups_table(ctx: Context) -> dict[int, tuple[str, set[str]]]:
    """gid -> (name, members) from /etc/group."""
    raw = ctx.host.read_text(GROUP)
    table: dict[int, tuple[str, set[str]]] = {}
    for parts in parse_colon_file(raw.value if raw.ok else "", 4):
        if is_decimal(parts[2]):
            table.setdefault(int(parts[2]), (parts[0], {m.strip() for m in parts[3].split(",") if m.strip()}))
    return table


def find_account(ctx: Context, name: str) -> Account | None:
    raw = ctx.host.read_text(PASSWD)
    for parts in parse_colon_file(raw.value if raw.ok else "", 7):
        if parts[0] == name and is_decimal(parts[2]) and is_decimal(parts[3]):
            return Account(name, int(parts[2]), int(parts[3]), parts[5])
    identity = ctx.host.identity()
    if identity is not None and identity.user == name:
        return Account(name, identity.uid, identity.gid, "")
    return None


def target_user(ctx: Context) -> str | None:
    if ctx.options.user:
        return ctx.options.user
    identity = ctx.host.identity()
    return identity.user if identity else None


def can_open(uid: int, gids: set[int], st: StatInfo) -> bool:
    if uid == 0:
        return True
    if st.uid == uid:
        return st.mode & 0o600 == 0o600
    if st.gid in gids:
        return st.mode & 0o060 == 0o060
    return st.mode & 0o006 == 0o006


def describe(st: StatInfo, groups: dict[int, tuple[str, set[str]]]) -> str:
    group = groups.get(st.gid, (str(st.gid), set()))[0]
    return f"{st.path} (group {group}, mode {st.mode:04o})"


def udev_tags(ctx: Context, st: StatInfo) -> set[str]:
    if not st.rdev or st.type != "char":
        return set()
    raw = ctx.host.read_text(f"{UDEV_DATA}/c{st.rdev}", limit=64 * 1024)
    lines = raw.value.splitlines() if raw.ok else []
    return {line[2:].strip() for line in lines if line[:2] in ("G:", "Q:")}


def acl_grants(ctx: Context, st: StatInfo, uid: int, gids: set[int]) -> bool | None:
    """Whether the node's ACL gives this uid (or one of its groups) read-write; None when unreadable."""
    read = ctx.host.acl(st.path)
    if not read.ok:
        return None
    entries = [e.split(":", 2) for e in read.value if e.count(":") == 2]
    mask = next((perm for kind, _, perm in entries if kind == "mask"), "rw-")
    for kind, qualifier, perm in entries:
        if not is_decimal(qualifier):
            continue
        named = (kind == "user" and int(qualifier) == uid) or (kind == "group" and int(qualifier) in gids)
        if named and all(ch in perm and ch in mask for ch in "rw"):
            return True
    return False


def id_map(ctx: Context, path: str) -> list[tuple[int, int, int]] | None:
    raw = ctx.host.read_text(path, limit=4096)
    if not raw.ok:
        return None
    rows = []
    for line in raw.value.splitlines():
        parts = line.split()
        if len(parts) == 3 and all(is_decimal(p) for p in parts):
            rows.append((int(parts[0]), int(parts[1]), int(parts[2])))
    return rows or None


def user_namespace(ctx: Context) -> dict[str, str] | None:
    """The uid/gid maps when this runs in a user namespace (unprivileged LXC, LXD, rootless containers)."""
    maps = {name: id_map(ctx, path) for name, path in (("uid_map", UID_MAP), ("gid_map", GID_MAP))}
    if all(m is None or m == IDENTITY_MAP for m in maps.values()):
        return None
    return {name: "; ".join(" ".join(map(str, row)) for row in rows) for name, rows in maps.items() if rows}


def overflow_gid(ctx: Context) -> int:
    raw = ctx.host.read_int(OVERFLOW_GID)
    return raw.value if raw.ok else DEFAULT_OVERFLOW_GID


@check(
    "access.devices",
    "The vLLM user can open /dev/kfd and the render nodes",
    depends=("driver.loaded",),
    reads=(
        PASSWD,
        GROUP,
        DEV_KFD,
        "/dev/dri",
        RENDER_NODES,
        f"{UDEV_DATA}/c*",
        UID_MAP,
        GID_MAP,
        OVERFLOW_GID,
        *CONTAINER_READS,
        "/proc",
        PROC_STATUS,
    ),
    env=CONTAINER_ENV,
)
def access_devices(ctx: Context) -> Result:
    name = target_user(ctx)
    if name is None:
        return warned(
            "cannot tell who runs this (no identity)", "Pass --user NAME to check that user's access."
        )
    for path in (PASSWD, GROUP):
        # A refused read is not an absence: an unreadable /etc/group would drop every membership.
        read = ctx.host.read_text(path)
        if read.state.value in ("denied", "unreadable"):
            return failed(
                f"cannot read {path} ({read.describe()}): the user's groups are unknown",
                f"Run as root (or make {path} readable, as it is by default: mode 0644).",
            )
    account = find_account(ctx, name)
    if account is None:
        return failed(
            f"user {name!r} does not exist in {PASSWD}",
            "Create the service user first (or pass --user with an existing account).",
        )
    groups = groups_table(ctx)
    member_of = {gid for gid, (_, members) in groups.items() if name in members} | {account.gid}
    devices = [st for st in (ctx.host.stat(p) for p in [DEV_KFD, *render_nodes(ctx)]) if st is not None]
    details = {
        "user": name,
        "uid": account.uid,
        "groups": sorted(groups[g][0] if g in groups else str(g) for g in member_of),
        "devices": {st.path: st.to_json() for st in devices},
    }
    userns = user_namespace(ctx)
    if userns:
        details["user_namespace"] = userns
    container = detect_container(ctx)
    if container is not None:
        details["container"] = container.to_json()
    blocked_now = [st for st in devices if not can_open(account.uid, member_of, st)]
    if container is not None and container.oci and blocked_now:
        # The nodes and their gids come from the host's `docker run`: only its options can fix them.
        gids = sorted({st.gid for st in blocked_now})
        named = [
            f"{st.path} (gid {st.gid}{', ' + groups[st.gid][0] if st.gid in groups else ', no name inside'})"
            for st in blocked_now
        ]
        return failed(
            f"{name} cannot open {', '.join(named)} in this {container.kind} container ({container.evidence})",
            run_remedy(ctx, container, gids, overflow_gid(ctx)) + ".",
            **details,
        )
    kfd_opens = any(st.path == DEV_KFD and can_open(account.uid, member_of, st) for st in devices)
    unmapped = [
        st for st in devices if st.gid == overflow_gid(ctx) and not can_open(account.uid, member_of, st)
    ]
    unnamed = [st for st in devices if st.gid not in groups and not can_open(account.uid, member_of, st)]
    if unmapped or (unnamed and userns):
        st = (unmapped or unnamed)[0]
        half = (
            f"{DEV_KFD} opens but {st.path} does not, so ROCm finds no GPU (a known LXC/LXD failure); "
            if kfd_opens and st.path != DEV_KFD
            else ""
        )
        where = f" ({'; '.join(f'{k} {v}' for k, v in userns.items())})" if userns else ""
        return failed(
            f"{half}{st.path} belongs to gid {st.gid}, the overflow group: its group on the host is not mapped "
            f"into this user namespace{where}"
            if st in unmapped
            else f"{half}{st.path} belongs to gid {st.gid}, which has no name in {GROUP}, inside a user namespace{where}",
            CONTAINER_REMEDY + f"; then add {name} to that group.",
            **details,
        )
    if unnamed:
        return failed(
            f"{unnamed[0].path} belongs to gid {unnamed[0].gid}, which has no name in {GROUP} "
            "(a container's gid mapping?)",
            f"Map the device to the host's render group (`chgrp render {unnamed[0].path}; chmod 0660 ...`, or fix the "
            "container's gid= mapping), then add the user to render.",
            **details,
        )
    blocked = [st for st in devices if not can_open(account.uid, member_of, st)]
    tagged = {st.path for st in blocked if "uaccess" in udev_tags(ctx, st)}
    via_acl = [st for st in blocked if st.path in tagged and acl_grants(ctx, st, account.uid, member_of)]
    blocked = [st for st in blocked if st not in via_acl]
    if tagged:
        details["uaccess_tagged"] = sorted(tagged)
    # never a group whose gid is 0 (a container's /etc/group can name gid 0 render)
    needed_groups = sorted({"render", "video"} & {g[0] for gid, g in groups.items() if gid != 0})
    # A node of group root (gid 0): joining group root would hand the user every root-group file, so the
    # remedy is a group on the node itself (udev's render rule on the host, or the container's mapping).
    root_owned = [st for st in blocked if st.gid == 0]
    if blocked and len(root_owned) == len(blocked):
        where = f" In this container: {CONTAINER_REMEDY}." if container is not None else ""
        return failed(
            f"{name} cannot open {', '.join(describe(st, groups) for st in blocked)}: the node belongs to group "
            "root (gid 0), which no service user should join",
            f'Give the node group render, mode 0660, on the host (udev\'s rule: `SUBSYSTEM=="kfd", '
            f'GROUP="render", MODE="0660"`, or `sudo chgrp render {blocked[0].path}`), then add {name} to '
            f"render.{where}",
            **details,
        )
    if blocked:
        needed = sorted({groups[st.gid][0] for st in blocked if st.gid != 0})
        uaccess_note = (
            f" (udev's uaccess tag on {', '.join(sorted(tagged & {st.path for st in blocked}))} grants an ACL only to "
            "the active local seat session, and this user has none; a service never does)"
            if tagged & {st.path for st in blocked}
            else ""
        )
        half = (
            f"{DEV_KFD} opens but {', '.join(st.path for st in blocked)} does not, so ROCm finds no GPU; "
            if kfd_opens and all(st.path != DEV_KFD for st in blocked) and userns
            else ""
        )
        root_note = (
            f" {', '.join(st.path for st in root_owned)} belongs to group root (gid 0), which no service user "
            f"should join: give it group render, mode 0660, on the host (`sudo chgrp render "
            f"{root_owned[0].path}` or udev's rule)."
            if root_owned
            else ""
        )
        return failed(
            f"{half}{name} cannot open {', '.join(describe(st, groups) for st in blocked)}: "
            f"not in group {', '.join(needed)}{uaccess_note}",
            f"sudo usermod -aG {','.join(sorted(set(needed) | set(needed_groups)))} "
            f"{name}, then log out and back in (restart services running as {name})."
            + root_note
            + (f" In this container: {CONTAINER_REMEDY}." if half else ""),
            **details,
            **fixable("groups"),
        )
    if via_acl:
        groups_text = ",".join(needed_groups) or "render"
        return warned(
            f"{name} opens {', '.join(st.path for st in via_acl)} only through udev's uaccess ACL, which "
            "systemd-logind grants to the active desktop session: a service running as "
            f"{name}, or the same user after logout, loses it",
            f"sudo usermod -aG {groups_text} {name}, then log out and back in.",
            acl_only=[st.path for st in via_acl],
            **details,
            **fixable("groups"),
        )
    identity = ctx.host.identity()
    if identity is not None and identity.user == name and account.uid != 0:
        session = set(identity.process_gids) | {identity.gid}
        stale = [st for st in devices if not can_open(account.uid, session, st)]
        if stale:
            group = groups[stale[0].gid][0]
            return warned(
                f"{name} is in group {group} in {GROUP}, but this login session was started before that",
                f"Log out and back in (or run `newgrp {group}`); services pick it up on restart.",
                session_gids=sorted(session),
                **details,
            )
    stale_pids = stale_processes(ctx, account, devices)
    if stale_pids:
        # /etc/group is written, but processes of this user started before it keep their old groups
        # (credentials(7)): the membership takes effect at their restart or the next login.
        return warned(
            f"written; takes effect after a new login: {name} is in the nodes' groups in {GROUP}, but its running "
            f"process(es) {', '.join(map(str, stale_pids[:5]))} started before that and cannot open them",
            f"Restart the services running as {name} (or log in again).",
            pending={
                "setting": "groups",
                "after": ["a new login or a restart of the processes"],
                "pids": stale_pids,
            },
            **details,
        )
    return passed(
        f"{name} can open {len(devices)} device node(s): {', '.join(st.path for st in devices)}", **details
    )


def stale_processes(ctx: Context, account: Account, devices: list[StatInfo]) -> list[int]:
    """Processes of this user (not this one: access.devices judges its own session above) whose
    supplementary groups do not open a node that /etc/group says the user can: a login or a service
    started before the membership was written."""
    if account.uid == 0 or not devices:
        return []
    found = []
    for pid in ctx.host.pids()[:MAX_PROCESSES]:
        raw = ctx.host.read_text(f"/proc/{pid}/status", limit=8192)
        if not raw.ok:
            continue
        fields = dict(line.split(":", 1) for line in raw.value.splitlines() if ":" in line)
        uids, gids = (
            fields.get("Uid", "").split(),
            fields.get("Groups", "").split() + fields.get("Gid", "").split()[:1],
        )
        if not uids or uids[0] != str(account.uid) or not all(g.isdecimal() for g in gids):
            continue
        if not all(can_open(account.uid, {int(g) for g in gids}, st) for st in devices):
            found.append(pid)
    return found
