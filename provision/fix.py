"""`rocmdoctor fix`: the remedies that can be applied safely, each a planned change through the write seam.

Pure plan first (`plan`): what the diagnosis asked for (plain `Wanted`, computed by the command from the
checks: provision never imports checks) against the target's current files and accounts, read through
HostWriter. Then `apply` through HostWriter (files, group membership, the distro's own tools) and
host_processes (stopping orphaned vLLM engines). Every item says what must happen before its check can
pass (a reboot, a new login) and what cannot be undone. On a tree (an image) only file and account changes
apply; running tools and stopping processes need this machine.

Sources of the remedies: host-facts.md section 5 (`options ttm pages_limit=N` in /etc/modprobe.d, then the
initramfs and a reboot), the udev defaults for /dev/kfd and render nodes (group render, mode 0660), each
distribution's command-line tool (grubby: Fedora/RHEL; kernelstub: Pop!_OS; systemd-boot's
/boot/loader/entries/*.conf `options` line; GRUB's /etc/default/grub + update-grub / grub2-mkconfig).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

from rocmdoctor.host_processes import HeldProcess, stop_held
from rocmdoctor.host_writes import HostWriter, WriteRefused, with_members
from rocmdoctor.model import Change

UDEV_RULE_PATH = "/etc/udev/rules.d/70-rocmdoctor-amdgpu.rules"
UDEV_RULE = (
    "# Written by `rocmdoctor fix`: the ROCm device nodes for the render group (udev's defaults).\n"
    'SUBSYSTEM=="kfd", KERNEL=="kfd", GROUP="render", MODE="0660"\n'
    'SUBSYSTEM=="drm", KERNEL=="renderD*", GROUP="render", MODE="0660"\n'
)
GRUB_DEFAULT = "/etc/default/grub"
LOADER_ENTRIES = "/boot/loader/entries"
INITRAMFS = {
    "ubuntu": ["update-initramfs", "-u"],
    "debian": ["update-initramfs", "-u"],
    "arch": ["mkinitcpio", "-P"],
}
GRUB_UPDATE = {
    "ubuntu": ["update-grub"],
    "debian": ["update-grub"],
    "fedora": ["grub2-mkconfig", "-o", "/boot/grub2/grub.cfg"],
    "opensuse": ["grub2-mkconfig", "-o", "/boot/grub2/grub.cfg"],
    "arch": ["grub-mkconfig", "-o", "/boot/grub/grub.cfg"],
}
DKMS_REMOVE = {
    "ubuntu": ["apt-get", "remove", "--purge", "-y", "amdgpu-dkms", "amdgpu-dkms-firmware"],
    "debian": ["apt-get", "remove", "--purge", "-y", "amdgpu-dkms", "amdgpu-dkms-firmware"],
    "fedora": ["dnf", "remove", "-y", "amdgpu-dkms"],
    "opensuse": ["zypper", "--non-interactive", "remove", "amdgpu-dkms"],
    "arch": ["pacman", "-Rns", "--noconfirm", "amdgpu-dkms"],
}
TOOL_TIMEOUT_S = 600


class FixError(ValueError):
    """A change could not be applied; the message says which and why."""


@dataclass(frozen=True)
class Wanted:
    """What the diagnosis asks for, as plain data (the command computes it from the checks)."""

    user: str
    family: str  # ubuntu, debian, fedora, arch, opensuse, other
    groups: tuple[str, ...] = ()  # groups the service user must be in (those the target has)
    ttm_pages: int | None = None
    ttm_modules: tuple[str, ...] = ("ttm",)
    cmdline_add: tuple[str, ...] = ()  # e.g. "iommu=pt"
    cmdline_remove: tuple[str, ...] = ()  # parameter names, e.g. "amdgpu.gttsize"
    udev: bool = False
    # Orphaned vLLM engines judged by their identity, each held through a pidfd until it is signalled.
    orphans: tuple[HeldProcess, ...] = ()
    orphans_left: tuple[str, ...] = ()  # vLLM orphans not ours to stop (another user's), and why
    dkms_remove: bool = False
    tools: tuple[str, ...] = ()  # boot-loader tools present on the target: grubby, kernelstub


@dataclass
class Item:
    id: str
    title: str
    why: str
    files: list[tuple[str, bytes | None, bytes, int]] = field(default_factory=list)  # path, old, new, mode
    run: list[list[str]] = field(default_factory=list)  # tools of this machine, after the files
    groups: list[str] = field(default_factory=list)
    user: str = ""  # whose groups change
    pids: list[int] = field(default_factory=list)
    held: list[HeldProcess] = field(default_factory=list, repr=False)  # the pids' processes
    before_check: str = ""  # what must come before the check can pass: "reboot", "new login", ""
    cannot_undo: str = ""
    refused: str = ""  # why it cannot apply to this target (printed, not applied)
    result: str = ""

    @property
    def changes(self) -> bool:
        return bool(self.files or self.run or self.groups or self.pids)

    def diff(self) -> str:
        parts: list[str] = []
        for path, old, new, _mode in self.files:
            parts += difflib.unified_diff(
                (old or b"").decode(errors="replace").splitlines(keepends=True),
                new.decode(errors="replace").splitlines(keepends=True),
                fromfile=f"{path} (now)" if old is not None else "/dev/null",
                tofile=path,
            )
        parts += [f"+ run: {' '.join(argv)}\n" for argv in self.run]
        parts += [f"+ stop: pid {pid}\n" for pid in self.pids]
        return "".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "why": self.why,
            "changes": self.changes,
            "files": [path for path, *_ in self.files],
            "run": [" ".join(a) for a in self.run],
            "pids": self.pids,
            "before_check": self.before_check,
            "cannot_undo": self.cannot_undo,
            "refused": self.refused,
            "result": self.result,
            "diff": self.diff(),
        }


def _text(writer: HostWriter, path: str) -> bytes | None:
    return writer.read_current(path)


def groups_item(writer: HostWriter, wanted: Wanted) -> Item | None:
    if not wanted.groups:
        return None
    item = Item(
        "groups",
        f"Add {wanted.user} to {', '.join(wanted.groups)}",
        "access to /dev/kfd and the render nodes",
    )
    current = _text(writer, "/etc/group")
    text = (current or b"").decode(errors="replace")
    members = {
        f[0]: {m for m in f[3].split(",") if m}
        for f in (ln.split(":") for ln in text.splitlines())
        if len(f) > 3
    }
    if not any(
        line.split(":", 1)[0] == wanted.user
        for line in (_text(writer, "/etc/passwd") or b"").decode().splitlines()
    ):
        item.refused = (
            f"user {wanted.user} does not exist here (`rocmdoctor unit --write` creates the service user)"
        )
        return item
    missing = [g for g in wanted.groups if g in members and wanted.user not in members[g]]
    if missing:
        item.groups = missing
        item.user = wanted.user
        new = with_members(text, wanted.user, missing, 3).encode()
        item.files.append(("/etc/group", current, new, 0o644))
        item.before_check = f"a new login of {wanted.user} (or a restart of its services)"
    return item


def ttm_item(writer: HostWriter, wanted: Wanted) -> Item | None:
    if not wanted.ttm_pages:
        return None
    gib = wanted.ttm_pages // 262144
    item = Item(
        "ttm",
        f"TTM limit {wanted.ttm_pages} pages ({gib} GiB) in /etc/modprobe.d",
        "memory.ttm: the GPU can reach only part of RAM",
    )
    for module in wanted.ttm_modules:
        path = f"/etc/modprobe.d/{module}.conf"
        current = _text(writer, path)
        line = f"options {module} pages_limit={wanted.ttm_pages}"
        edited = [
            _without_pages_limit(ln, module) for ln in (current or b"").decode(errors="replace").splitlines()
        ]
        kept = [ln for ln in edited if ln is not None]
        new = ("\n".join([*kept, line]) + "\n").encode()
        if current != new:
            item.files.append((path, current, new, 0o644))
    if item.files:
        initramfs = INITRAMFS.get(wanted.family, ["dracut", "-f"])
        item.before_check = f"`{' '.join(initramfs)}` and a reboot (ttm reads its limit when it loads)"
    return item


def _without_pages_limit(line: str, module: str) -> str | None:
    """A modprobe.d line without its `pages_limit=` for `module` (None when nothing else is left)."""
    words = line.split()
    if words[:2] != ["options", module]:
        return line
    rest = [w for w in words[2:] if not w.startswith("pages_limit=")]
    return " ".join(["options", module, *rest]) if rest else None


def _edit_cmdline(words: list[str], add: tuple[str, ...], remove: tuple[str, ...]) -> list[str]:
    kept = [w for w in words if w.split("=", 1)[0] not in remove]
    return kept + [a for a in add if a not in kept]


def _grub_default(text: str, add: tuple[str, ...], remove: tuple[str, ...]) -> str:
    def edit(match: re.Match[str]) -> str:
        words = _edit_cmdline(match.group(2).split(), add, remove)
        return f'{match.group(1)}"{" ".join(words)}"'

    pattern = re.compile(r'^(GRUB_CMDLINE_LINUX_DEFAULT=)"([^"]*)"', re.MULTILINE)
    if pattern.search(text):
        return pattern.sub(edit, text, count=1)
    return text + f'GRUB_CMDLINE_LINUX_DEFAULT="{" ".join(_edit_cmdline([], add, remove))}"\n'


def cmdline_item(writer: HostWriter, wanted: Wanted) -> Item | None:
    if not wanted.cmdline_add and not wanted.cmdline_remove:
        return None
    what = [*(f"add {a}" for a in wanted.cmdline_add), *(f"remove {r}" for r in wanted.cmdline_remove)]
    item = Item("cmdline", "Kernel command line: " + ", ".join(what), "env.multi_gpu / memory.ttm")
    item.before_check = "a reboot"
    if "kernelstub" in wanted.tools:
        item.run += [["kernelstub", "-a", a] for a in wanted.cmdline_add]
        item.run += [["kernelstub", "-d", r] for r in wanted.cmdline_remove]
        return item
    if "grubby" in wanted.tools:
        args = [f"--args={' '.join(wanted.cmdline_add)}"] if wanted.cmdline_add else []
        args += [f"--remove-args={' '.join(wanted.cmdline_remove)}"] if wanted.cmdline_remove else []
        item.run.append(["grubby", "--update-kernel=ALL", *args])
        return item
    entries = [n for n in writer.listdir(LOADER_ENTRIES) if n.endswith(".conf")]
    if entries:
        for name in sorted(entries):
            path = f"{LOADER_ENTRIES}/{name}"
            entry = _text(writer, path) or b""
            lines = entry.decode(errors="replace").splitlines()
            new_lines = [
                "options "
                + " ".join(_edit_cmdline(ln.split()[1:], wanted.cmdline_add, wanted.cmdline_remove))
                if ln.startswith("options ")
                else ln
                for ln in lines
            ]
            edited = ("\n".join(new_lines) + "\n").encode()
            if edited != entry:
                item.files.append((path, entry, edited, 0o644))
        return item
    current = _text(writer, GRUB_DEFAULT)
    if current is None:
        item.refused = (
            "no boot-loader configuration found (grubby, kernelstub, systemd-boot entries or /etc/default/grub): "
            "add it with your boot loader's tool"
        )
        return item
    new = _grub_default(current.decode(errors="replace"), wanted.cmdline_add, wanted.cmdline_remove).encode()
    if new != current:
        item.files.append((GRUB_DEFAULT, current, new, 0o644))
        item.run.append(GRUB_UPDATE.get(wanted.family, ["update-grub"]))
    return item


def udev_item(writer: HostWriter, wanted: Wanted) -> Item | None:
    if not wanted.udev:
        return None
    item = Item("udev", "udev rule: /dev/kfd and render nodes to group render, mode 0660", "access.devices")
    current = _text(writer, UDEV_RULE_PATH)
    if current != UDEV_RULE.encode():
        item.files.append((UDEV_RULE_PATH, current, UDEV_RULE.encode(), 0o644))
        item.run += [["udevadm", "control", "--reload-rules"], ["udevadm", "trigger"]]
    return item


def orphans_item(writer: HostWriter, wanted: Wanted) -> Item | None:
    if not wanted.orphans and not wanted.orphans_left:
        return None
    labels = ", ".join(f"{p.label()} [{p.why}]" for p in wanted.orphans) or "none of them is ours to stop"
    item = Item("orphans", f"Stop orphaned vLLM engines: {labels}", "processes.orphans: they keep GPU memory")
    if wanted.orphans_left:
        item.why += "; left alone: " + "; ".join(wanted.orphans_left)
    item.held = list(wanted.orphans)
    item.pids = [p.pid for p in wanted.orphans]
    item.cannot_undo = "a stopped process is gone (its server, if any, must be started again)"
    return item


def dkms_item(writer: HostWriter, wanted: Wanted) -> Item | None:
    if not wanted.dkms_remove:
        return None
    item = Item("dkms", "Remove the amdgpu DKMS driver that shadows the in-tree one", "driver.dkms")
    argv = DKMS_REMOVE.get(wanted.family)
    if argv is None:
        item.refused = "no known package manager for this distribution: remove amdgpu-dkms yourself"
        return item
    item.run.append(argv)
    item.before_check = "a reboot (the in-tree amdgpu loads at the next boot)"
    item.cannot_undo = "the package is removed (reinstall it with amdgpu-install to go back)"
    return item


PLANNERS = (groups_item, ttm_item, cmdline_item, udev_item, orphans_item, dkms_item)
IDS = ("groups", "ttm", "cmdline", "udev", "orphans", "dkms")


def plan(writer: HostWriter, wanted: Wanted, only: tuple[str, ...] = ()) -> list[Item]:
    """Every remedy the diagnosis asks for, against the target's current state; `only` keeps those ids."""
    items = [i for i in (p(writer, wanted) for p in PLANNERS) if i is not None]
    if only:
        items = [i for i in items if i.id in only]
    if not writer.is_live:
        for item in items:
            if item.pids and not item.refused:
                item.refused = "processes run on a machine, not in an image tree"
            elif item.run and not item.files and not item.refused:
                item.refused = f"`{' '.join(item.run[0])}` runs on the booted machine, not on an image tree"
            elif item.run:
                item.run = []  # the files change; the tool runs when the image boots (said in before_check)
    return items


def apply(writer: HostWriter, items: list[Item]) -> None:
    """Apply the items that are not refused, each through the seam; FixError names the one that failed."""
    for item in items:
        if item.refused or not item.changes:
            continue
        try:
            if item.groups:
                writer.add_to_groups(item.user, item.groups)
            for path, _old, new, mode in item.files:
                if path == "/etc/group" and item.groups:
                    continue  # add_to_groups wrote it (usermod on this machine)
                writer.write_file(path, new, mode)
            for argv in item.run:
                writer.run(argv)
            if item.pids:
                # Only through the pidfds held since the plan: a PID reused meanwhile is never signalled.
                ended = stop_held(item.held)
                item.result = ", ".join(f"{pid} {how}" for pid, how in sorted(ended.items()))
        except (WriteRefused, OSError) as exc:
            raise FixError(f"{item.id}: {exc}") from None
        item.result = item.result or "applied"


def change(items: list[Item], check_only: bool, notes: list[str]) -> Change:
    pending = [i for i in items if i.changes and not i.refused]
    diff = "".join(i.diff() for i in pending)
    if not pending:
        msg = "nothing to change"
    elif check_only:
        msg = f"would apply {len(pending)} change(s): {', '.join(i.id for i in pending)}"
    else:
        msg = f"applied {len(pending)} change(s): {', '.join(i.id for i in pending)}"
    return Change(
        changed=bool(pending),
        msg=msg,
        diff=diff,
        data={"check": check_only, "items": [i.to_json() for i in items], "notes": notes},
    )
