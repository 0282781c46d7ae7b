"""Can the user who will run vLLM open /dev/kfd and the render nodes (groups, modes, stale logins)?"""

from __future__ import annotations

from dataclasses import dataclass

from ..host import StatInfo
from ..model import Result, failed, passed, warned
from ..registry import Context
from . import check
from .driver import DEV_KFD, RENDER_NODES, render_nodes

PASSWD = "/etc/passwd"
GROUP = "/etc/group"


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
        if parts[2].isdigit():
            table.setdefault(int(parts[2]), (parts[0], {m.strip() for m in parts[3].split(",") if m.strip()}))
    return table


def find_account(ctx: Context, name: str) -> Account | None:
    raw = ctx.host.read_text(PASSWD)
    for parts in parse_colon_file(raw.value if raw.ok else "", 7):
        if parts[0] == name and parts[2].isdigit() and parts[3].isdigit():
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


@check(
    "access.devices",
    "The vLLM user can open /dev/kfd and the render nodes",
    depends=("driver.loaded",),
    reads=(PASSWD, GROUP, DEV_KFD, "/dev/dri", RENDER_NODES),
)
def access_devices(ctx: Context) -> Result:
    name = target_user(ctx)
    if name is None:
        return warned(
            "cannot tell who runs this (no identity)", "Pass --user NAME to check that user's access."
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
    unnamed = [st for st in devices if st.gid not in groups and not can_open(account.uid, member_of, st)]
    if unnamed:
        return failed(
            f"{unnamed[0].path} belongs to gid {unnamed[0].gid}, which has no name in {GROUP} "
            "(a container's gid mapping?)",
            f"Map the device to the host's render group (`chgrp render {unnamed[0].path}; chmod 0660 ...`, or fix the "
            "container's gid= mapping), then add the user to render.",
            **details,
        )
    blocked = [st for st in devices if not can_open(account.uid, member_of, st)]
    if blocked:
        needed = sorted({groups[st.gid][0] for st in blocked})
        return failed(
            f"{name} cannot open {', '.join(describe(st, groups) for st in blocked)}: "
            f"not in group {', '.join(needed)}",
            f"sudo usermod -aG {','.join(sorted(set(needed) | {'render', 'video'} & {g[0] for g in groups.values()}))} "
            f"{name}, then log out and back in (restart services running as {name}).",
            **details,
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
    return passed(
        f"{name} can open {len(devices)} device node(s): {', '.join(st.path for st in devices)}", **details
    )
