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


def run_remedy(ctx: Context, container: Container, gids: list[int]) -> str:
    """What to add to the host's `docker run`/`podman run`: the devices, the gids, and seccomp when filtered."""
    parts = [OCI_DEVICES]
    if gids:
        parts.append(group_add(gids))
    if seccomp_filtered(ctx):
        parts.append(SECCOMP)
    return (
        f"Recreate the {container.kind} container with `{' '.join(parts)}` on the host's `{container.kind} run` "
        "(chgrp or usermod inside the container cannot change the gid the host's device nodes carry)"
    )
