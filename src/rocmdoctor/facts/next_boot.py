"""What the host will have at its next boot, from every source of a setting and their real precedence.

Fed by `Host` reads, pure otherwise; `checks/` (the pending state of memory.ttm) and `provision/fix.py`
(what to write, and whether anything overrides it) ask the same questions here. Rules and sources
(docs/fix.md has them as a table):

- Which boot loader booted: GRUB's `linux` command puts `BOOT_IMAGE=` first on the command line it
  passes (GRUB manual, "linux"); systemd-boot sets the `LoaderInfo` EFI variable of the Boot Loader
  Interface (systemd.io/BOOT_LOADER_INTERFACE). Pop!_OS's kernelstub and Fedora's grubby own their
  entries when installed.
- GRUB's command line for the next boot is `GRUB_CMDLINE_LINUX` then `GRUB_CMDLINE_LINUX_DEFAULT`
  (10_linux's `linux_entry`), after `grub-mkconfig` sources /etc/default/grub and then
  /etc/default/grub.d/*.cfg in glob order (Debian/Ubuntu's grub2 packaging), so the last assignment wins.
- systemd-boot boots a BLS entry's `options`; kernel-install(8) writes the next kernel's entry from
  /etc/kernel/cmdline, else /usr/lib/kernel/cmdline, else the running /proc/cmdline.
- modprobe.d(5): files of the same name in /etc, /run, /usr/local/lib, /usr/lib, /lib: the first
  directory wins; the files are read in name order; options given on the kernel command line as
  `module.param=value` are added after them, so the command line wins (a later value overrides an
  earlier one when the module parses its parameters).
- initramfs-tools, dracut and mkinitcpio copy modprobe.d into the initramfs; a module loaded from there
  reads that copy, so a changed file counts only after the image is rebuilt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rocmdoctor.facts import boot_files
from rocmdoctor.host import Host, ReadState

PROC_CMDLINE = "/proc/cmdline"
GRUB_DEFAULT = "/etc/default/grub"
GRUB_DIR = "/etc/default/grub.d"
GRUB_VARS = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")
KERNEL_CMDLINE = ("/etc/kernel/cmdline", "/usr/lib/kernel/cmdline")
ENTRY_DIRS = ("/boot/loader/entries", "/efi/loader/entries", "/boot/efi/loader/entries")
LOADER_INFO = "/sys/firmware/efi/efivars/LoaderInfo-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"
MODPROBE_DIRS = (
    "/etc/modprobe.d",
    "/run/modprobe.d",
    "/usr/local/lib/modprobe.d",
    "/usr/lib/modprobe.d",
    "/lib/modprobe.d",
)
TOOL_PATHS = {"grubby": ("/usr/sbin/grubby", "/usr/bin/grubby"), "kernelstub": ("/usr/bin/kernelstub",)}
# The initramfs image of a kernel, per tool (initramfs-tools, dracut, mkinitcpio's default preset).
INITRAMFS_IMAGES = ("initrd.img-{kernel}", "initramfs-{kernel}.img")
READS = (
    PROC_CMDLINE,
    GRUB_DEFAULT,
    f"{GRUB_DIR}/*.cfg",
    *KERNEL_CMDLINE,
    *(f"{d}/*.conf" for d in ENTRY_DIRS),
    LOADER_INFO,
    *(f"{d}/*.conf" for d in MODPROBE_DIRS),
    *(p for paths in TOOL_PATHS.values() for p in paths),
    "/boot",
)
READ_LIMIT = 1 << 20


def _text(host: Host, path: str) -> str | None:
    raw = host.read_text(path, limit=READ_LIMIT)
    if raw.ok:
        return str(raw.value)
    return "" if raw.state == ReadState.EMPTY else None


def _conf_files(host: Host, directory: str, suffix: str) -> list[str]:
    # sorted() is the C locale's byte order, the order of a shell glob in grub-mkconfig and kmod's strcmp.
    return [f"{directory}/{n}" for n in sorted(host.listdir(directory)) if n.endswith(suffix)]


@dataclass(frozen=True)
class Source:
    """One place the next boot's command line comes from, with its words (None: cannot be read or modelled)."""

    path: str
    words: tuple[str, ...] | None
    note: str = ""


@dataclass(frozen=True)
class BootConfig:
    loader: str  # grub, systemd-boot, kernelstub, grubby, unknown
    evidence: str
    running: tuple[str, ...]
    sources: tuple[Source, ...] = ()
    grub_files: tuple[str, ...] = ()  # /etc/default/grub and the grub.d files, in the order sourced

    def param(self, name: str) -> list[tuple[str, str | None]]:
        """(source, value) of `name` on each source of the next boot's command line that sets it; a source
        that cannot be read counts with value None."""
        found: list[tuple[str, str | None]] = []
        for source in self.sources:
            if source.words is None:
                found.append((source.path, None))
                continue
            value = boot_files.param_value(list(source.words), name)
            if value is not None:
                found.append((source.path, value))
        return found

    def next_value(self, name: str) -> str | None:
        """The value the next boot's command line gives `name` (the one that every source agrees on; the
        running line when no source is known)."""
        if not self.sources:
            return boot_files.param_value(list(self.running), name)
        values = {v for _, v in self.param(name)}
        return values.pop() if len(values) == 1 else None

    def to_json(self) -> dict[str, object]:
        return {
            "loader": self.loader,
            "evidence": self.evidence,
            "sources": [
                {"path": s.path, "cmdline": None if s.words is None else " ".join(s.words), "note": s.note}
                for s in self.sources
            ],
        }


def grub_sources(host: Host) -> tuple[list[str], Source]:
    files = [GRUB_DEFAULT, *_conf_files(host, GRUB_DIR, ".cfg")]
    texts = [(path, _text(host, path)) for path in files]
    present = [(p, t) for p, t in texts if t is not None]
    values = boot_files.evaluate(present, GRUB_VARS)
    where = sorted({w for _, w in values.values() if w})
    label = " + ".join(where) if where else GRUB_DEFAULT
    parts = [values[v][0] for v in GRUB_VARS]
    if any(p is None for p in parts):
        return [p for p, _ in present], Source(
            label, None, "a value this reader cannot evaluate (command, expansion)"
        )
    words = boot_files.cmdline_words(" ".join(p for p in parts if p))
    return [p for p, _ in present], Source(label, tuple(words))


def entry_sources(host: Host) -> list[Source]:
    sources = []
    for directory in ENTRY_DIRS:
        for path in _conf_files(host, directory, ".conf"):
            text = _text(host, path)
            words = None if text is None else tuple(boot_files.cmdline_words(boot_files.bls_options(text)))
            sources.append(Source(path, words))
    return sources


def kernel_install_source(host: Host, running: tuple[str, ...]) -> Source:
    for path in KERNEL_CMDLINE:
        text = _text(host, path)
        if text is not None:
            return Source(path, tuple(boot_files.cmdline_words(boot_files.kernel_cmdline_file(text))))
    kept = tuple(w for w in running if boot_files.param_name(w) not in ("BOOT_IMAGE", "initrd"))
    return Source(
        PROC_CMDLINE, kept, "kernel-install copies the running command line (no /etc/kernel/cmdline)"
    )


def boot_config(host: Host, tools: tuple[str, ...] | None = None) -> BootConfig:
    """The boot loader the running system came from and the sources of its next command line."""
    running = tuple(boot_files.cmdline_words(_text(host, PROC_CMDLINE) or ""))
    if tools is None:
        tools = tuple(name for name, paths in TOOL_PATHS.items() if any(host.exists(p) for p in paths))
    entries = entry_sources(host)
    grub_here = host.exists(GRUB_DEFAULT)
    booted_grub = bool(running) and running[0].startswith("BOOT_IMAGE=")
    if "kernelstub" in tools:
        return BootConfig("kernelstub", "kernelstub is installed (Pop!_OS)", running, tuple(entries))
    if "grubby" in tools:
        files = grub_sources(host)[0] if grub_here else []
        return BootConfig("grubby", "grubby is installed", running, tuple(entries), tuple(files))
    if host.exists(LOADER_INFO) or (entries and not grub_here and not booted_grub):
        evidence = (
            "the LoaderInfo EFI variable (systemd-boot)"
            if host.exists(LOADER_INFO)
            else "BLS entries and no /etc/default/grub"
        )
        return BootConfig("systemd-boot", evidence, running, (kernel_install_source(host, running), *entries))
    if grub_here or booted_grub:
        files, grub = grub_sources(host)
        evidence = (
            f"{PROC_CMDLINE} starts with BOOT_IMAGE= (GRUB)" if booted_grub else f"{GRUB_DEFAULT} exists"
        )
        return BootConfig("grub", evidence, running, (grub,), tuple(files))
    return BootConfig("unknown", "no boot-loader configuration found", running)


# -- modprobe.d -----------------------------------------------------------------------------------


def modprobe_files(host: Host) -> list[str]:
    """modprobe.d's files in the order kmod reads them: by name, a name in an earlier directory hiding it in
    the later ones."""
    chosen: dict[str, str] = {}
    for directory in MODPROBE_DIRS:
        for name in host.listdir(directory):
            if name.endswith(".conf") and name not in chosen:
                chosen[name] = f"{directory}/{name}"
    return [chosen[name] for name in sorted(chosen)]


@dataclass(frozen=True)
class ModuleParam:
    """A module parameter at the next load: its value and where it comes from."""

    module: str
    param: str
    value: str | None
    source: str  # "" when nothing sets it (the module's default)
    files: dict[str, str] = field(default_factory=dict)  # modprobe.d file -> its value
    cmdline: list[tuple[str, str | None]] = field(default_factory=list)  # command-line source -> its value

    @property
    def overridden_by_cmdline(self) -> bool:
        return bool(self.cmdline)


def module_param(host: Host, boot: BootConfig, module: str, param: str) -> ModuleParam:
    files: dict[str, str] = {}
    value, source = None, ""
    for path in modprobe_files(host):
        text = _text(host, path)
        for word in boot_files.modprobe_options(text or "", module):
            if boot_files.param_name(word) == param:
                value, source = word.split("=", 1)[1] if "=" in word else "", path
                files[path] = value
    cmdline = boot.param(f"{boot_files.module_name(module)}.{param}")
    if cmdline:
        value = boot.next_value(f"{boot_files.module_name(module)}.{param}")
        source = " and ".join(s for s, _ in cmdline) + " (kernel command line)"
    return ModuleParam(module, param, value, source, files, cmdline)


def initramfs_image(host: Host, kernel: str | None) -> str | None:
    """The initramfs image the running kernel boots with, when there is one: initramfs-tools' and dracut's
    name the kernel; mkinitcpio names its image after the kernel package (/boot/initramfs-linux-cachyos.img:
    any but the fallback). Found by listing /boot, never by reading an image (a snapshot keeps no image)."""
    names = set(host.listdir("/boot"))
    for pattern in INITRAMFS_IMAGES:
        name = pattern.format(kernel=kernel)
        if kernel and name in names:
            return f"/boot/{name}"
    for name in sorted(names):
        if name.startswith("initramfs-linux") and name.endswith(".img") and "fallback" not in name:
            return f"/boot/{name}"
    return None
