"""A real systemd: boot the cached Debian root (tests/setup/50-nspawn-rootfs.sh) with systemd-nspawn.

    machine = boot("serve-unit", netns="serve-unit", binds=[Bind("/work/repo", read_only=True)])
    machine.run(["systemctl", "start", "vllm"])
    machine.stop()

Each machine boots from the one read-only base with --volatile=overlay (every boot starts clean,
several can run at once), lives in its own network namespace (its 127.0.0.1:8000 is its own; reach
it from the host with `ip netns exec NETNS ...`) and its own control group (emptied when it stops),
and runs commands through nsenter into the container's namespaces, so no sshd or machined is needed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

# Booting takes ~2 s alone; beside three workers running engines on 2 cores it once took over 90 s.
BOOT_TIMEOUT_S = 240.0


def rootfs() -> Path:
    cache = Path(os.environ.get("ROCMDOCTOR_TEST_CACHE") or "/root/.cache/rocmdoctor-test")
    return cache / "nspawn-rootfs"


@dataclass(frozen=True)
class Bind:
    source: str
    target: str | None = None  # default: the same path inside
    read_only: bool = True

    def option(self) -> str:
        return f"--bind{'-ro' if self.read_only else ''}={self.source}:{self.target or self.source}"


# Each machine's own control group, in every hierarchy this host tracks processes in. nspawn with
# --keep-unit puts the container under its own group's "payload"; from this VM's root group every
# machine got the same /payload, so a unit of one machine shared its directory with the same unit of
# every other (and with what a killed machine left there). systemd 252 cannot kill a group holding a
# process of another PID namespace (cgroup.procs lists it as 0: cg_kill_recursive fails with EIO,
# "skip unmapped pids" came in v254) and then restarts the unit beside its leftovers.
CGROUP_ROOTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup")
CGROUP_PARENT = "rocmdoctor-machines"


def machine_cgroups(name: str) -> list[Path]:
    """Where machine `name`'s group goes: the unified hierarchy (/sys/fs/cgroup on a cgroup v2 host,
    /sys/fs/cgroup/unified on a hybrid one) and systemd's named legacy hierarchy where mounted."""
    found = []
    for mount in map(Path, CGROUP_ROOTS):
        if mount == Path("/sys/fs/cgroup") and not (mount / "cgroup.controllers").exists():
            continue  # legacy controllers at the top: not a hierarchy of its own
        if (mount / "cgroup.procs").exists():
            found.append(mount / CGROUP_PARENT / name)
    return found


def group_pids(group: Path) -> set[int]:
    """Every process in `group` and the groups below it (as this PID namespace numbers them)."""
    pids: set[int] = set()
    for procs in group.rglob("cgroup.procs") if group.is_dir() else ():
        try:
            pids.update(int(word) for word in procs.read_text().split() if word != "0")
        except OSError:
            continue
    return pids


def empty_and_remove(group: Path, timeout: float = 30.0) -> None:
    """SIGKILL everything left in `group` (a machine whose nspawn was killed leaves its PID 1 and what it
    had not stopped), wait until it is empty, remove its directories from the bottom up."""
    deadline = time.monotonic() + timeout
    while (pids := group_pids(group)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    if pids:
        raise RuntimeError(f"{group}: processes {sorted(pids)} survived SIGKILL for {timeout:.0f} s")
    for directory in sorted((d for d in group.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
        directory.rmdir()
    if group.exists():
        group.rmdir()


class BootError(RuntimeError):
    pass


@dataclass
class Machine:
    name: str
    netns: str
    process: subprocess.Popen
    log_path: Path
    _leader: int | None = field(default=None, repr=False)

    @property
    def leader(self) -> int:
        """The container's PID 1 (systemd), as seen from the host. nspawn's first child can be its own
        short-lived set-up process (slow to go on a loaded machine): only a child that runs systemd is
        the leader, and one that is gone is looked up again."""
        if self._leader is not None and psutil.pid_exists(self._leader):
            return self._leader
        self._leader = None
        for child in psutil.Process(self.process.pid).children():
            try:
                if child.name() == "systemd":
                    self._leader = child.pid
                    return child.pid
            except psutil.Error:
                continue
        raise BootError(f"{self.name}: systemd-nspawn has no systemd child yet")

    def run(
        self, cmd: Sequence[str] | str, timeout: float = 120.0, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess:
        """Run a command inside the container (as root, in all its namespaces); a string goes to sh -c."""
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        done = subprocess.run(
            ["nsenter", "--target", str(self.leader), "--all", "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
        )
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
        return done

    def unit_property(self, unit: str, prop: str) -> str:
        """One property of a unit of the machine's systemd (`systemctl show -p PROP --value UNIT`)."""
        return self.run(["systemctl", "show", "-p", prop, "--value", unit]).stdout.strip()

    def host_run(self, argv: Sequence[str], timeout: float = 60.0) -> subprocess.CompletedProcess:
        """Run a host command inside the machine's network namespace (to reach its loopback)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.netns, *argv], capture_output=True, text=True, timeout=timeout
        )

    def wait_running(self, timeout: float = BOOT_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BootError(
                    f"{self.name}: systemd-nspawn exited {self.process.returncode}:\n{self.log()}"
                )
            try:
                # --wait returns when the boot ends; bounded, so one stuck call cannot use up the budget
                state = self.run(
                    ["systemctl", "is-system-running", "--wait"],
                    timeout=max(1.0, min(30.0, deadline - time.monotonic())),
                    check=False,
                ).stdout.strip()
            except (BootError, psutil.Error, subprocess.TimeoutExpired):
                state = ""
            if state in ("running", "degraded"):
                return state
            time.sleep(0.5)
        raise BootError(
            f"{self.name}: not running after {timeout:.0f} s (state {state!r}):\n{self.log()}\n{self.jobs()}"
        )

    def jobs(self) -> str:
        """What the container's systemd is still doing (for a boot that does not end)."""
        try:
            return self.run(["systemctl", "list-jobs", "--no-pager"], timeout=10, check=False).stdout
        except (BootError, psutil.Error, subprocess.TimeoutExpired) as exc:
            return f"(no job list: {exc})"

    def user_processes(self, user: str) -> list[str]:
        """`PID STAT PPID ARGS` of every process of `user` that has not exited. An exited process
        waiting for its parent to collect it (a zombie) holds no memory and runs nothing; on a loaded
        machine PID 1 of the container collects it late, so it is not counted."""
        done = self.run(["ps", "-u", user, "-o", "pid=,stat=,ppid=,args="], check=False)
        rows = [line.split(None, 3) for line in done.stdout.splitlines()]
        return [" ".join(row) for row in rows if len(row) >= 2 and not row[1].startswith("Z")]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> None:
        """Power off (SIGTERM to nspawn makes the container's systemd shut down), then kill what is left
        in the machine's control group (all of it, if the shutdown did not end) and drop the netns."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for group in machine_cgroups(self.name):
            empty_and_remove(group)
        subprocess.run(["ip", "netns", "delete", self.netns], capture_output=True)


def boot(
    name: str,
    netns: str | None = None,
    binds: Sequence[Bind] = (),
    log_dir: Path | None = None,
    base: Path | None = None,
    timeout: float = BOOT_TIMEOUT_S,
    unified: bool = True,
) -> Machine:
    """Boot a container named `name` in network namespace `netns` (created; default: the name)."""
    base = base or rootfs()
    if not (base / "usr/lib/systemd/systemd").exists():
        raise BootError(f"no nspawn root at {base}: run tests/setup/50-nspawn-rootfs.sh")
    if shutil.which("systemd-nspawn") is None:
        raise BootError("systemd-nspawn is missing: run tests/setup/10-system-packages.sh")
    netns = netns or name
    subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
    subprocess.run(["ip", "netns", "add", netns], check=True, capture_output=True)
    subprocess.run(["ip", "netns", "exec", netns, "ip", "link", "set", "lo", "up"], check=True)
    log_path = (log_dir or Path("/tmp")) / f"{name}.nspawn.log"
    argv = [
        "systemd-nspawn",
        "--quiet",
        "-D",
        str(base),
        "--volatile=overlay",
        "--boot",
        "--register=no",
        "--keep-unit",
        f"--network-namespace-path=/run/netns/{netns}",
        f"--machine={name}",
        f"--hostname={name}",
        "--console=pipe",
        *(b.option() for b in binds),
    ]
    # The container's systemd on the unified cgroup hierarchy, as on the hosts rocmdoctor serves (every
    # supported distribution boots cgroup v2), whatever this test machine's own: on the legacy hierarchy
    # inside a container systemd does not wait for a unit's leftover processes to die before restarting
    # it (systemd commit 743970d2, src/core/unit.c: "for nspawn we actually can't wait for cgroups
    # running empty since systemd will get exactly zero notifications about it"), a condition no
    # supported host has.
    # (unified=False: the legacy hierarchy, for a test of what a container on it does.)
    env = {**os.environ, "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY": "1" if unified else "0"}
    groups = machine_cgroups(name)
    for group in groups:
        empty_and_remove(group)  # what a machine of this name left, if its stop never ran
        group.mkdir(parents=True)
    # nspawn starts in the machine's own groups (a shell that moves itself, then execs nspawn).
    enter = " ".join(f"echo $$ > {group / 'cgroup.procs'} &&" for group in groups)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            ["sh", "-c", f'{enter} exec "$@"', "sh", *argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    machine = Machine(name, netns, process, log_path)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                _ = machine.leader  # raises until the machine has a leader
                break
            except (BootError, psutil.Error):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise BootError(f"{name}: systemd-nspawn did not start:\n{machine.log()}") from None
                time.sleep(0.2)
        machine.wait_running(max(1.0, deadline - time.monotonic()))
    except BaseException:
        machine.stop()
        raise
    return machine
