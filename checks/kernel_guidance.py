"""`rocmdoctor fix-kernel`: the commands that fix what kernel.*, driver.dkms and memory.ttm found,
for the distribution at hand. Pure functions over check results; nothing here reads the host."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rocmdoctor.checks.memory_guidance import PAGES_PER_GIB
from rocmdoctor.model import envelope

# The checks whose findings this guidance answers (their prerequisites come along).
GUIDED_CHECKS = ("kernel.version", "kernel.cwsr", "driver.dkms", "memory.ttm")
PROBLEM = ("fail", "warn")
CWSR_GREP = 'grep -E "cwsr_size|ctl_stack_size" /sys/class/kfd/kfd/topology/nodes/*/properties'


@dataclass(frozen=True)
class Step:
    id: str
    title: str
    why: str
    commands: tuple[str, ...]
    verify: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "why": self.why,
            "commands": list(self.commands),
            "verify": list(self.verify),
        }


@dataclass(frozen=True)
class Finding:
    status: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)
    remedy: str = ""


def distro_family(distro_id: str | None, like: str | None) -> str:
    """ubuntu, debian, fedora, arch, opensuse, or 'other'."""
    names = [distro_id or ""] + (like or "").split()
    for name in names:
        if name in ("ubuntu", "debian", "fedora", "arch"):
            return name
        if name.startswith("opensuse") or name in ("suse", "sles"):
            return "opensuse"
        if name in ("rhel", "centos"):
            return "fedora"
    return "other"


def kernel_commands(family: str, distro_id: str | None, version: str | None) -> tuple[str, ...]:
    version = version or ""
    if distro_id == "ubuntu" and version.startswith("24.04"):
        return (
            "sudo apt update",
            "sudo apt install --install-recommends linux-generic-hwe-24.04   # 6.17.0-19 or later",
            "# or, on OEM machines: sudo apt install linux-oem-24.04   # 6.14.0-1018 or later",
            "sudo reboot",
        )
    if distro_id == "ubuntu" and version.startswith("22.04"):
        return (
            "# Ubuntu 22.04 has no kernel with the CWSR export: move to 24.04, then take its HWE kernel",
            "sudo do-release-upgrade",
            "sudo apt install --install-recommends linux-generic-hwe-24.04",
            "sudo reboot",
        )
    if family == "ubuntu":  # 26.04 and later ship the fix in their own kernel
        return ("sudo apt update", "sudo apt full-upgrade", "sudo reboot")
    if family == "debian":
        suite = {"12": "bookworm", "13": "trixie"}.get(version.split(".")[0], "trixie")
        return (
            "sudo apt update",
            f"sudo apt install -t {suite}-backports linux-image-amd64   # 6.18.4+ (or 6.12.64+ on 6.12 LTS)",
            "sudo reboot",
        )
    if family == "fedora":
        return ("sudo dnf upgrade --refresh 'kernel*'   # Fedora 43 ships 6.18.4 or later", "sudo reboot")
    if family == "arch":
        return ("sudo pacman -Syu linux   # or your kernel package (linux-lts: 6.12.64+)", "sudo reboot")
    if family == "opensuse" and "leap" in (distro_id or ""):
        return (
            (
                "sudo zypper addrepo -f https://download.opensuse.org/repositories/Kernel:/stable:/Backport/standard/"
                " kernel-stable-backport"
            ),
            "sudo zypper install --from kernel-stable-backport kernel-default",
            "sudo reboot",
        )
    if family == "opensuse":
        return ("sudo zypper dup   # Tumbleweed ships 6.18.4 or later", "sudo reboot")
    return (
        "# install a kernel >= 6.18.4 (or 6.12.64+ on the 6.12 LTS line) from your distribution",
        "sudo reboot",
    )


def dkms_commands(family: str) -> tuple[str, ...]:
    remove = {
        "ubuntu": "sudo apt remove --purge amdgpu-dkms amdgpu-dkms-firmware",
        "debian": "sudo apt remove --purge amdgpu-dkms amdgpu-dkms-firmware",
        "fedora": "sudo dnf remove amdgpu-dkms",
        "opensuse": "sudo zypper remove amdgpu-dkms",
        "arch": "sudo pacman -Rns amdgpu-dkms",
    }.get(family, "# remove the amdgpu-dkms package with your package manager")
    reinstall = (
        "sudo amdgpu-install -y --usecase=rocm --no-dkms   # only if you want ROCm userspace from AMD's repo",
    )
    return (
        remove,
        *(reinstall if family in ("ubuntu", "debian", "fedora", "opensuse") else ()),
        "sudo reboot",
    )


def dkms_align_commands(family: str, rocm: str | None) -> tuple[str, ...]:
    """Instinct: keep amdgpu-dkms (AMD's datacenter driver) and move it to the userspace's ROCm release."""
    release = rocm or "<your ROCm release>"
    fetch = {
        "ubuntu": f"sudo apt install ./amdgpu-install_*.deb   # from https://repo.radeon.com/amdgpu-install/{release}/ubuntu/",
        "debian": f"sudo apt install ./amdgpu-install_*.deb   # from https://repo.radeon.com/amdgpu-install/{release}/ubuntu/",
        "fedora": f"sudo dnf install ./amdgpu-install-*.rpm   # from https://repo.radeon.com/amdgpu-install/{release}/rhel/",
        "opensuse": f"sudo zypper install ./amdgpu-install-*.rpm   # from https://repo.radeon.com/amdgpu-install/{release}/sle/",
    }.get(family, f"# install amdgpu-install for ROCm {release} (https://repo.radeon.com/amdgpu-install/)")
    return (fetch, "sudo amdgpu-install -y --usecase=dkms", "sudo reboot")


def cmdline_remove_commands(family: str, argument: str) -> tuple[str, ...]:
    """Take a parameter off the kernel command line, the way each family's boot loader keeps it."""
    if family in ("ubuntu", "debian"):
        return (
            f"sudo sed -i -E 's/ ?{argument}=[^ \"]*//g' /etc/default/grub",
            "sudo update-grub",
            "sudo reboot",
        )
    if family in ("fedora", "opensuse"):
        return (f"sudo grubby --update-kernel=ALL --remove-args={argument}", "sudo reboot")
    return (f"# remove {argument}=... from your boot loader's kernel command line", "sudo reboot")


def initramfs_command(family: str) -> str:
    return {
        "ubuntu": "sudo update-initramfs -u",
        "debian": "sudo update-initramfs -u",
        "arch": "sudo mkinitcpio -P",
    }.get(family, "sudo dracut -f")


def ttm_commands(family: str, pages: int, modules: list[str]) -> tuple[str, ...]:
    lines = [f'echo "options {m} pages_limit={pages}" | sudo tee /etc/modprobe.d/{m}.conf' for m in modules]
    return (*lines, initramfs_command(family), "sudo reboot")


def guidance(distro: dict[str, Any], kernel: str | None, findings: dict[str, Finding]) -> dict[str, Any]:
    """The fix-kernel document: steps for every guided check that warned or failed."""
    family = distro_family(distro.get("id"), distro.get("like"))
    steps: list[Step] = []
    dkms = findings.get("driver.dkms")
    # DKMS first: left installed, it rebuilds itself for the new kernel and shadows it again.
    if dkms and dkms.status in PROBLEM and dkms.details.get("instinct"):
        rocm = dkms.details.get("userspace_rocm_release")
        steps.append(
            Step(
                "dkms-align",
                f"Keep amdgpu-dkms and match it to ROCm {rocm or 'userspace'} (AMD's datacenter driver)",
                dkms.summary,
                dkms_align_commands(family, rocm),
                (
                    "cat /sys/module/amdgpu/version",
                    "dkms status amdgpu",
                    "rocmdoctor check --only driver.dkms",
                ),
            )
        )
    elif dkms and dkms.status in PROBLEM:
        steps.append(
            Step(
                "dkms",
                "Remove the amdgpu DKMS driver so the in-tree amdgpu loads",
                dkms.summary,
                dkms_commands(family),
                (
                    "test -e /sys/module/amdgpu/version && echo 'still DKMS' || echo in-tree",
                    "modinfo -n amdgpu   # under kernel/drivers/gpu/drm/amd/amdgpu/",
                    "rocmdoctor check --only driver.dkms",
                ),
            )
        )
    cwsr, version = findings.get("kernel.cwsr"), findings.get("kernel.version")
    kernel_problems = [f for f in (version, cwsr) if f and f.status in PROBLEM]
    if kernel_problems or (dkms and dkms.status == "fail" and not dkms.details.get("instinct")):
        minimum = (version.details.get("minimum") if version else None) or "6.18.4"
        why = "; ".join(f.summary for f in kernel_problems) or "the DKMS driver hides the kernel's own amdgpu"
        steps.append(
            Step(
                "kernel",
                f"Boot a kernel with the CWSR export (minimum {minimum})",
                why,
                kernel_commands(family, distro.get("id"), distro.get("version")),
                (
                    "uname -r",
                    CWSR_GREP + "   # both lines on every GPU node",
                    "rocmdoctor check --only 'kernel.*'",
                ),
            )
        )
    removing_dkms = any(step.id == "dkms" for step in steps)
    steps.extend(ttm_steps(family, findings.get("memory.ttm"), removing_dkms))
    found_gpu = findings.get("gpu.present")
    if found_gpu is not None and found_gpu.status != "pass":
        headline = f"No AMD GPU to fix the kernel for: {found_gpu.summary}"
    elif steps:
        headline = f"{len(steps)} thing(s) to fix on {distro.get('name') or family} with kernel {kernel}"
    else:
        headline = f"Nothing needs fixing: kernel {kernel} is fine for the GPU(s) found."
    return envelope(
        distro={
            "id": distro.get("id") or None,
            "version": distro.get("version") or None,
            "family": family,
        },
        kernel=kernel,
        needs_fixing=bool(steps),
        headline=headline,
        steps=[s.to_json() for s in steps],
        findings={cid: {"status": f.status, "summary": f.summary} for cid, f in findings.items()},
    )


def ttm_pages_step(family: str, pages: int, modules: list[str], why: str) -> Step:
    return Step(
        "ttm",
        f"Let the GPU reach {pages // PAGES_PER_GIB} GiB of RAM (ttm.pages_limit={pages})",
        why,
        ttm_commands(family, pages, modules),
        (
            *(f"cat /sys/module/{m}/parameters/pages_limit   # {pages}" for m in modules),
            f"cat /sys/class/drm/card*/device/mem_info_gtt_total   # {pages * 4096}",
            "rocmdoctor check --only memory.ttm",
        ),
    )


def ttm_steps(family: str, ttm: Finding | None, removing_dkms: bool = False) -> list[Step]:
    """Every memory.ttm warning or failure gets a step: the fix-kernel document must never drop what check
    asked for (a carve-out to shrink, amdgpu.gttsize to remove, a limit to raise, values to read). And a limit
    set on the DKMS driver's amdttm is lost with it: the in-tree amdgpu reads ttm.pages_limit, whose default
    is half of RAM (host-facts.md §5; ROCm/ROCm#5562, Debian 13 with amdttm.pages_limit=32768000)."""
    if ttm is None:
        return []
    details = ttm.details
    if (details.get("pending") or {}).get("meets_target"):
        return []  # written for the next boot: what is left is the reboot memory.ttm names
    if ttm.status not in PROBLEM:
        limits = details.get("pages_limit") or {}
        amdttm = limits.get("amdttm")
        if not (removing_dkms and details.get("governing") == "amdttm" and amdttm):
            return []
        pages = min(int(amdttm), int(details.get("suggested_pages_limit") or amdttm))
        if int(limits.get("ttm") or 0) >= pages:
            return []  # the in-tree ttm already has the limit (set beside amdttm, as AMD's guides do)
        return [
            ttm_pages_step(
                family,
                pages,
                ["ttm"],
                f"{ttm.summary}, but amdttm leaves with amdgpu-dkms: the in-tree amdgpu reads ttm.pages_limit, "
                "whose default is half of RAM",
            )
        ]
    limits = details.get("pages_limit") or {}
    modules = ["ttm", "amdttm"] if "amdttm" in limits or details.get("governing") == "amdttm" else ["ttm"]
    steps: list[Step] = []
    carveout = details.get("carveout")
    if isinstance(carveout, dict) and carveout.get("suggested_pages_limit"):
        pages = int(carveout["suggested_pages_limit"])
        steps.append(
            Step(
                "carveout",
                "Shrink the BIOS carve-out to 512 MB so the memory goes to GTT, where vLLM can use it",
                ttm.summary + ". " + str(carveout.get("why", "")).strip(),
                (
                    (
                        "# reboot into the firmware setup (often Del or F2), find UMA Frame Buffer Size / iGPU memory /"
                        " VRAM size, set 512M, save"
                    ),
                    "sudo systemctl reboot --firmware-setup   # on UEFI machines that support it",
                ),
                (
                    "cat /sys/class/drm/card*/device/mem_info_vram_total   # about 536870912",
                    "grep MemTotal /proc/meminfo   # the carve-out is back in RAM",
                ),
            )
        )
        steps.append(ttm_pages_step(family, pages, modules, "after the carve-out shrinks: " + ttm.summary))
        return steps
    if "amdgpu.gttsize" in ttm.summary or details.get("gttsize_caps"):
        steps.append(
            Step(
                "gttsize",
                "Remove amdgpu.gttsize from the kernel command line (ttm.pages_limit alone sets GTT)",
                ttm.summary,
                cmdline_remove_commands(family, "amdgpu.gttsize"),
                ("cat /proc/cmdline   # no amdgpu.gttsize", "rocmdoctor check --only memory.ttm"),
            )
        )
        return steps
    if details.get("suggested_pages_limit"):
        pages = int(details["suggested_pages_limit"])
        if "disagree" in ttm.summary and limits.get(details.get("governing")):
            pages = int(limits[details["governing"]])
        return [ttm_pages_step(family, pages, modules, ttm.summary)]
    return [
        Step(
            "ttm-read",
            "Read the TTM limit and RAM that memory.ttm could not",
            ttm.summary,
            (
                *((f"# {ttm.remedy}",) if ttm.remedy else ()),
                "sudo cat /sys/module/ttm/parameters/pages_limit /proc/meminfo",
            ),
            ("rocmdoctor check --only memory.ttm",),
        )
    ]
