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
from dataclasses import dataclass, field, replace
from typing import Any

from rocmdoctor.facts import boot_files, next_boot, remedies
from rocmdoctor.facts.boot_files import decode, encode
from rocmdoctor.host import Host
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
    kernel: str | None = None  # the running kernel (its initramfs image)
    ram_bytes: int | None = None  # MemTotal: the RAM the host boots with until a carve-out changes
    depends: str = ""  # a step not done that the TTM limit depends on (the BIOS carve-out)
    host_only: str = ""  # inside a container: the runtime; what only the host can change is refused


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
    answers: tuple[str, ...] = ()  # the check ids this remedy answers (facts/remedies.py)
    note: str = ""  # another source that decides the value, and what the plan does about it

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
            "answers": list(self.answers),
            "title": self.title,
            "why": self.why,
            "note": self.note,
            "changes": self.changes,
            "files": [path for path, *_ in self.files],
            "run": [" ".join(a) for a in self.run],
            "pids": self.pids,
            "groups": self.groups,
            "before_check": self.before_check,
            "cannot_undo": self.cannot_undo,
            "refused": self.refused,
            "result": self.result,
            "diff": self.diff(),
        }


def _text(writer: HostWriter, path: str) -> bytes | None:
    return writer.read_current(path)


def _table(raw: bytes | None) -> list[list[str]]:
    """The colon-separated rows of /etc/group or /etc/passwd (bytes that are not UTF-8 kept as they are)."""
    return [ln.split(":") for ln in decode(raw or b"").splitlines()]


def groups_item(writer: HostWriter, wanted: Wanted) -> Item | None:
    if not wanted.groups:
        return None
    item = Item(
        "groups",
        f"Add {wanted.user} to {', '.join(wanted.groups)}",
        "access to /dev/kfd and the render nodes",
    )
    try:
        current, passwd = _text(writer, "/etc/group"), _text(writer, "/etc/passwd")
        unreadable = current is None and writer.current_mode("/etc/group") is not None
    except (WriteRefused, OSError) as exc:
        unreadable, current, passwd = True, None, None
        item.why += f" ({exc})"
    if unreadable:
        # read as absent, it would look like a host without render and video
        item.refused = "/etc/group exists but cannot be read (not a regular file, or denied): run fix as root"
        return item
    rows = _table(current)
    members = {f[0]: {m for m in f[3].split(",") if m} for f in rows if len(f) > 3}
    gids = {f[0]: f[2] for f in rows if len(f) > 3}
    if not any(f[0] == wanted.user for f in _table(passwd)):
        item.refused = (
            f"user {wanted.user} does not exist here (`rocmdoctor unit --write` creates the service user)"
        )
        return item
    # A group with gid 0 grants every file of group root: never a remedy for a device node.
    root_groups = [g for g in wanted.groups if gids.get(g, "").strip() == "0"]
    missing = [
        g for g in wanted.groups if g in members and wanted.user not in members[g] and g not in root_groups
    ]
    if root_groups:
        item.why += f"; {', '.join(root_groups)} left out: gid 0 is group root"
    if missing:
        item.groups = missing
        item.user = wanted.user
        new = encode(with_members(decode(current or b""), wanted.user, missing, 3))
        item.files.append(("/etc/group", current, new, 0o644))
        item.before_check = f"a new login of {wanted.user} (or a restart of its services)"
    return item


def _boot(writer: HostWriter, wanted: Wanted) -> next_boot.BootConfig:
    return next_boot.boot_config(Host(writer.root), wanted.tools)


def ttm_item(writer: HostWriter, wanted: Wanted) -> Item | None:
    if not wanted.ttm_pages:
        return None
    gib = wanted.ttm_pages // 262144
    item = Item(
        "ttm",
        f"TTM limit {wanted.ttm_pages} pages ({gib} GiB) in /etc/modprobe.d",
        "memory.ttm: the GPU can reach only part of RAM",
    )
    if wanted.ram_bytes and wanted.ttm_pages * 4096 > wanted.ram_bytes and wanted.depends:
        # Written now, the limit would exceed the RAM this host boots with until the step it depends on is
        # done (a BIOS carve-out): memory.ttm would then call it "exceeds RAM".
        item.refused = (
            f"{gib} GiB is more than the {wanted.ram_bytes / (1 << 30):.0f} GiB of RAM the host boots with until "
            f"`{wanted.depends}` is done ({wanted.depends} first, then run fix again)"
        )
        return item
    host = Host(writer.root)
    boot = _boot(writer, wanted)
    on_cmdline = []
    for module in wanted.ttm_modules:
        param = next_boot.module_param(host, boot, module, "pages_limit")
        if param.overridden_by_cmdline:
            on_cmdline.append(f"{module}.pages_limit={wanted.ttm_pages}")
            continue
        _ttm_file(writer, item, module, wanted.ttm_pages, param)
    if on_cmdline:
        # kmod adds the command line's module options after modprobe.d's: a file would change nothing.
        item.title = f"TTM limit {wanted.ttm_pages} pages ({gib} GiB) on the kernel command line"
        item.note = (
            f"the kernel command line ({boot.loader}: {boot.evidence}) sets "
            f"{', '.join(w.split('=')[0] for w in on_cmdline)}, which kmod applies after modprobe.d "
            "(modprobe.d(5)): a modprobe.d file would change nothing, so it is changed there"
        )
        files, run, refused = boot_line_change(writer, boot, wanted.family, tuple(on_cmdline), ())
        item.files += files
        item.run += run
        item.refused = refused
        item.before_check = "a reboot"
    elif item.files:
        image = next_boot.initramfs_image(host, wanted.kernel)
        initramfs = INITRAMFS.get(wanted.family, ["dracut", "-f"])
        item.before_check = (
            f"`{' '.join(initramfs)}` (ttm may load from {image}, which holds a copy of modprobe.d) and a reboot"
            if image or wanted.kernel is None
            else "a reboot (ttm reads its limit when it loads)"
        )
    return item


def _ttm_file(writer: HostWriter, item: Item, module: str, pages: int, param: next_boot.ModuleParam) -> None:
    """`options MODULE pages_limit=N` where kmod reads it last: our file, or the /etc copy of a later
    file that sets it too (a file in /etc hides one of the same name in /usr/lib, /lib and /run)."""
    names = {path.rsplit("/", 1)[1] for path in param.files} | {f"{module}.conf"}
    name = max(names)
    path = f"/etc/modprobe.d/{name}"
    current = _text(writer, path)
    base = current
    if base is None and name != f"{module}.conf":
        hidden = next(p for p in param.files if p.endswith(f"/{name}"))
        base = _text(writer, hidden)
    line = f"options {module} pages_limit={pages}"
    edited = [_without_pages_limit(ln, module) for ln in decode(base or b"").splitlines()]
    kept = [ln for ln in edited if ln is not None]
    new = encode("\n".join([*kept, line]) + "\n")
    if param.value != str(pages) and current != new:
        item.files.append((path, current, new, 0o644))


def _without_pages_limit(line: str, module: str) -> str | None:
    """A modprobe.d line without its `pages_limit=` for `module` (None when nothing else is left)."""
    words = line.split()
    if words[:2] != ["options", module]:
        return line
    rest = [w for w in words[2:] if not w.startswith("pages_limit=")]
    return " ".join(["options", module, *rest]) if rest else None


def boot_line_change(
    writer: HostWriter, boot: next_boot.BootConfig, family: str, add: tuple[str, ...], remove: tuple[str, ...]
) -> tuple[list[tuple[str, bytes | None, bytes, int]], list[list[str]], str]:
    """The files and tools that put `add` on and take `remove` off the next boot's command line, where the
    boot loader that booted this system reads it (next_boot says which); or why it cannot."""
    files: list[tuple[str, bytes | None, bytes, int]] = []
    if boot.loader == "kernelstub":
        return (
            files,
            [*(["kernelstub", "-a", a] for a in add), *(["kernelstub", "-d", r] for r in remove)],
            "",
        )
    if boot.loader == "grubby":
        args = [f"--args={' '.join(add)}"] if add else []
        args += [f"--remove-args={' '.join(remove)}"] if remove else []
        return files, [["grubby", "--update-kernel=ALL", *args]], ""
    if boot.loader == "systemd-boot":
        for source in boot.sources:
            current = _text(writer, source.path) if source.path != next_boot.PROC_CMDLINE else None
            if source.path in next_boot.KERNEL_CMDLINE or source.path == next_boot.PROC_CMDLINE:
                # kernel-install writes the next kernel's entry from /etc/kernel/cmdline (kernel-install(8)):
                # without it, an edit of today's entries is lost at the next kernel update.
                path = next_boot.KERNEL_CMDLINE[0] if source.path == next_boot.PROC_CMDLINE else source.path
                if source.words is None or (current is None and not source.words):
                    continue
                old = decode(current) if current is not None else " ".join(source.words) + "\n"
                body = boot_files.kernel_cmdline_file(old)
                edited = boot_files.edit_line(body, add, remove)
                if current is None or edited != body:
                    files.append((path, current, encode(edited + "\n"), 0o644))
                continue
            if current is None:
                continue
            new = encode(boot_files.bls_edit(decode(current), add, remove))
            if new != current:
                files.append((source.path, current, new, 0o644))
        return files, [], ""
    if boot.loader == "grub":
        texts = [(path, decode(_text(writer, path) or b"")) for path in boot.grub_files or [GRUB_DEFAULT]]
        changed, error = boot_files.grub_edit(texts, add, remove)
        if error:
            return [], [], error
        for path, text in changed.items():
            current = _text(writer, path)
            files.append((path, current, encode(text), 0o644))
        run = [GRUB_UPDATE.get(family, ["update-grub"])] if files else []
        return files, run, ""
    return (
        files,
        [],
        (
            "no boot-loader configuration found (grubby, kernelstub, systemd-boot entries or /etc/default/grub): "
            "add it with your boot loader's tool"
        ),
    )


def cmdline_item(writer: HostWriter, wanted: Wanted) -> Item | None:
    if not wanted.cmdline_add and not wanted.cmdline_remove:
        return None
    what = [*(f"add {a}" for a in wanted.cmdline_add), *(f"remove {r}" for r in wanted.cmdline_remove)]
    item = Item("cmdline", "Kernel command line: " + ", ".join(what), "env.multi_gpu / memory.ttm")
    item.before_check = "a reboot"
    boot = _boot(writer, wanted)
    item.files, item.run, item.refused = boot_line_change(
        writer, boot, wanted.family, wanted.cmdline_add, wanted.cmdline_remove
    )
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


PLANNERS = {
    "groups": groups_item,
    "ttm": ttm_item,
    "cmdline": cmdline_item,
    "udev": udev_item,
    "orphans": orphans_item,
    "dkms": dkms_item,
}
IDS = tuple(remedies.FIXES)
# What only the host can change from inside a container: its kernel, its boot loader, its udev, its driver.
HOST_ONLY = ("ttm", "cmdline", "udev", "dkms")


def _limited(wanted: Wanted, params: set[str]) -> Wanted:
    """`wanted` with the kernel command line limited to the parameters a part id chose (cmdline.iommu)."""
    if not params:
        return wanted
    return replace(
        wanted,
        cmdline_add=tuple(a for a in wanted.cmdline_add if boot_files.param_name(a) in params),
        cmdline_remove=tuple(r for r in wanted.cmdline_remove if r in params),
    )


def plan(writer: HostWriter, wanted: Wanted, only: tuple[str, ...] = ()) -> list[Item]:
    """Every remedy the diagnosis asks for, against the target's current state; `only` keeps those ids (a
    remedy, a part of one, or a check id: facts/remedies.py)."""
    ids, params = remedies.selected(only)
    wanted = _limited(wanted, params)
    items = [
        i
        for i in (planner(writer, wanted) for fix, planner in PLANNERS.items() if not ids or fix in ids)
        if i
    ]
    for item in items:
        item.answers = remedies.FIXES[item.id]
        if wanted.host_only and item.id in HOST_ONLY and item.changes and not item.refused:
            item.refused = f"inside this container only the host can change it: {wanted.host_only}"
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
            if item.pids and writer.change("stop", ", ".join(p.label() for p in item.held)):
                # Only through the pidfds held since the plan: a PID reused meanwhile is never signalled;
                # the writer's gate, so a check-mode writer signals nothing whatever its caller does.
                ended = stop_held(item.held)
                item.result = ", ".join(f"{pid} {how}" for pid, how in sorted(ended.items()))
        except (WriteRefused, OSError) as exc:
            raise FixError(f"{item.id}: {exc}") from None
        item.result = item.result or "applied"


def change(writer: HostWriter, items: list[Item], notes: list[str]) -> Change:
    """The run's envelope; its wording and `check` from the writer's mode (the one place that knows it)."""
    pending = [i for i in items if i.changes and not i.refused]
    diff = "".join(i.diff() for i in pending)
    if not pending:
        msg = "nothing to change"
    else:
        msg = (
            f"{writer.past('applied', 'apply')} {len(pending)} change(s): {', '.join(i.id for i in pending)}"
        )
    return Change(
        changed=bool(pending),
        msg=msg,
        diff=diff,
        data={"check": writer.check_mode, "items": [i.to_json() for i in items], "notes": notes},
    )
