"""Is rocmdoctor running inside a container, and which kind: container remedies differ from host ones.

Signals, each a file the runtime leaves (none is proof alone, the first found names the kind):
- /.dockerenv: Docker creates it in every container's root;
- /run/.containerenv: Podman (and CRI-O) create it (containers/podman docs, "container environment");
- /run/systemd/container: systemd's own record of the container manager ("docker", "lxc", "systemd-nspawn"),
  written by PID 1 from the `container` variable the manager sets;
- the `container` environment variable (systemd's Container Interface: docker, podman, lxc, systemd-nspawn);
- /proc/1/cgroup naming docker, libpod, kubepods or lxc.

In a Docker or Podman container the device nodes come from the host's `docker run`: their gid is the host's
render gid, which often has no name inside the image; chgrp or usermod inside cannot fix that, only
`--group-add <gid>` (and `--device /dev/kfd --device /dev/dri`) on the host can (ROCm's and vLLM's
documented `docker run` lines: --device=/dev/kfd --device=/dev/dri --group-add video --ipc=host
--security-opt seccomp=unconfined).
"""

from __future__ import annotations

from dataclasses import dataclass

from rocmdoctor.registry import Context

DOCKERENV = "/.dockerenv"
CONTAINERENV = "/run/.containerenv"
SYSTEMD_CONTAINER = "/run/systemd/container"
PID1_CGROUP = "/proc/1/cgroup"
SELF_STATUS = "/proc/self/status"
ENV = ("container",)
READS = (DOCKERENV, CONTAINERENV, SYSTEMD_CONTAINER, PID1_CGROUP, SELF_STATUS)
# Kinds whose device nodes and groups are given by the host's `run` command line.
OCI = ("docker", "podman", "kubernetes", "oci")
CGROUP_WORDS = (("kubepods", "kubernetes"), ("libpod", "podman"), ("docker", "docker"), ("lxc", "lxc"))
OCI_DEVICES = "--device /dev/kfd --device /dev/dri"
SECCOMP = "--security-opt seccomp=unconfined"


@dataclass(frozen=True)
class Container:
    kind: str  # docker, podman, kubernetes, lxc, systemd-nspawn, ...
    evidence: str

    @property
    def oci(self) -> bool:
        return self.kind in OCI

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "evidence": self.evidence}


def detect(ctx: Context) -> Container | None:
    def read() -> Container | None:
        if ctx.host.exists(DOCKERENV):
            return Container("docker", f"{DOCKERENV} exists")
        if ctx.host.exists(CONTAINERENV):
            return Container("podman", f"{CONTAINERENV} exists")
        raw = ctx.host.read_text(SYSTEMD_CONTAINER, limit=256)
        if raw.ok and raw.value.strip():
            word = raw.value.strip().split()[0][:40]
            return Container(word, f"{SYSTEMD_CONTAINER} says {word}")
        env = ctx.host.env.get("container", "").strip()
        if env:
            return Container(env[:40], f"the container environment variable is {env[:40]!r}")
        cgroup = ctx.host.read_text(PID1_CGROUP, limit=64 * 1024)
        if cgroup.ok:
            for word, kind in CGROUP_WORDS:
                if word in cgroup.value:
                    return Container(kind, f"{PID1_CGROUP} names {word}")
        return None

    return ctx.memo("container.detect", read)


def seccomp_filtered(ctx: Context) -> bool:
    """Whether this process runs under a seccomp filter (`Seccomp: 2` in /proc/self/status)."""
    raw = ctx.host.read_text(SELF_STATUS, limit=64 * 1024)
    if not raw.ok:
        return False
    return any(line.split() == ["Seccomp:", "2"] for line in raw.value.splitlines())


def group_add(gids: list[int]) -> str:
    return " ".join(f"--group-add {g}" for g in sorted(set(gids)))


def run_remedy(ctx: Context, container: Container, gids: list[int], overflow: int | None = None) -> str:
    """What to add to the host's `docker run`/`podman run`: the devices, the gids, and seccomp when filtered.

    A node whose gid is the overflow id (its host group is not mapped into the container's user namespace)
    cannot be granted by number: `--group-add 65534` grants nothing. Rootless podman keeps the user's own
    supplementary groups with `--group-add keep-groups` (podman-run(1), crun); elsewhere the host's gid."""
    parts = [OCI_DEVICES]
    mapped = [g for g in gids if g != overflow]
    if overflow is not None and overflow in gids:
        parts.append(
            "--group-add keep-groups" if container.kind == "podman" else "--group-add <the host's render gid>"
        )
    if mapped:
        parts.append(group_add(mapped))
    if seccomp_filtered(ctx):
        parts.append(SECCOMP)
    return (
        f"Recreate the {container.kind} container with `{' '.join(parts)}` on the host's `{container.kind} run` "
        "(chgrp or usermod inside the container cannot change the gid the host's device nodes carry)"
    )


# The host-side change per runtime, for what only the host can change (its kernel, udev, the nodes' gid).
# Sources: Proxmox pct(1) `--devN path,gid=`; LXC lxc.container.conf(5) (lxc.cgroup2.devices.allow,
# lxc.mount.entry, lxc.idmap); podman-run(1) `--group-add keep-groups` (crun: the user's supplementary
# groups kept in a rootless container, where a host gid cannot be mapped by number); docker-run(1)
# `--group-add`; ROCm/k8s-device-plugin (`amd.com/gpu` resource).
def host_side_change(kind: str, details: dict) -> str:
    devices = details.get("devices") or {}
    majors = sorted({str(d.get("rdev", "")).split(":")[0] for d in devices.values() if d.get("rdev")})
    rootless = bool(details.get("user_namespace"))
    if kind == "lxc":
        allow = " ".join(f"`lxc.cgroup2.devices.allow = c {m}:* rwm`" for m in majors) or (
            "`lxc.cgroup2.devices.allow = c <major>:* rwm` for /dev/kfd and /dev/dri"
        )
        return (
            "on the Proxmox host `pct set <id> --dev0 /dev/kfd,gid=<render gid inside> --dev1 "
            "/dev/dri/renderD128,gid=<render gid inside>`; or in the LXC config "
            f"{allow}, `lxc.mount.entry = /dev/kfd dev/kfd none bind,optional,create=file`, "
            "`lxc.mount.entry = /dev/dri dev/dri none bind,optional,create=dir` and `lxc.idmap = g <render gid "
            "inside> <host render gid> 1` (with the ranges around it); on the host, the nodes' group is "
            "render (udev's default rule, `chgrp render /dev/kfd /dev/dri/renderD*`)"
        )
    if kind == "podman" and rootless:
        return f"recreate it with `{OCI_DEVICES} --group-add keep-groups` (rootless: a host gid cannot be mapped by number)"
    if kind in ("docker", "podman", "oci"):
        return (
            f"recreate it with `{OCI_DEVICES} --group-add <the host's render gid>` "
            "(`getent group render` on the host)"
        )
    if kind == "kubernetes":
        return (
            "deploy AMD's GPU device plugin (ROCm/k8s-device-plugin) on the node and request "
            "`resources: limits: amd.com/gpu: 1` in the pod"
        )
    return f"change it on the host of this {kind} container"
