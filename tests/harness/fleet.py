"""A fleet of fake hosts reachable over real SSH, for running the real ansible-playbook against.

Each fake host is one sshd in its own network namespace and its own mount + UTS namespace:
- its own loopback, so every host can serve on the same port (the port vLLM uses by default);
- its own `/opt` and `/etc/systemd/system` (bind mounts of a per-host directory), so installs and
  units of different hosts never meet and the machine's real `/opt` is never touched;
- its own hostname.
Everything else (the Python, the vLLM engine env, the test caches) is the machine's, shared.

Ansible reaches host `<ns>` through `ProxyCommand="ip netns exec <ns> nc 127.0.0.1 22"`. Every host
gets a unique `ansible_host` (the namespace name): the ProxyCommand ignores it, but SSH's
ControlPath is derived from it, and with one shared alias every host's tasks silently ran inside the
first host (provisioning-facts.md section 7, gotcha 1).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"
# The machine's own interpreter, named explicitly: discovery would pick a pyenv shim (gotcha 2).
TARGET_PYTHON = "/usr/bin/python3"
# Directories each fake host sees privately (bind mounts over the machine's own).
PRIVATE_DIRS = {"/opt": "opt", "/etc/systemd/system": "etc-systemd-system"}


class FleetError(RuntimeError):
    pass


@dataclass
class FakeHost:
    """One sshd in its own namespaces; `hostvars` go into the inventory beside the connection vars."""

    name: str  # inventory name
    netns: str  # network namespace name = hostname = ansible_host alias
    dir: Path  # private state: opt/, etc-systemd-system/, sshd_config, sshd.log, sshd.pid
    hostvars: dict = field(default_factory=dict)

    @property
    def opt(self) -> Path:
        """The directory this host sees as /opt."""
        return self.dir / "opt"

    @property
    def systemd_dir(self) -> Path:
        """The directory this host sees as /etc/systemd/system."""
        return self.dir / "etc-systemd-system"

    def sshd_pid(self) -> int | None:
        try:
            return int((self.dir / "sshd.pid").read_text().strip())
        except (OSError, ValueError):
            return None


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)


def netns_pids(netns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_netns(netns: str, grace_s: float = 10.0) -> None:
    """Stop every process living in `netns` (its sshd, sessions, servers it started), then delete it.

    Only processes inside this namespace are signalled: they can only have been started through
    this fleet host's sshd.
    """
    if not Path("/run/netns", netns).exists():
        return
    pids = netns_pids(netns)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in netns_pids(netns):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["ip", "netns", "delete", netns], capture_output=True)


class SshFleet:
    """N fake hosts under one work directory, one client key, one known_hosts file.

    `prefix` names the namespaces (`<prefix>-<i>`); keep it short and unique per test (hostnames
    are limited to 64 characters).
    """

    def __init__(self, prefix: str, workdir: Path):
        self.prefix = prefix
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.hosts: list[FakeHost] = []
        self.external: list[FakeHost] = []
        self.client_key = self.workdir / "clientkey"
        self.host_key = self.workdir / "hostkey"
        self.known_hosts = self.workdir / "known_hosts"
        self.authorized_keys = self.workdir / "authorized_keys"
        # ControlPath sockets must fit in 108 bytes: keep their directory short.
        self.control_dir = Path(tempfile.mkdtemp(prefix=f"{prefix}-cp-", dir="/tmp"))
        for key in (self.client_key, self.host_key):
            if not key.exists():
                _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{prefix}-test", "-f", str(key)])
        shutil.copyfile(f"{self.client_key}.pub", self.authorized_keys)
        self.authorized_keys.chmod(0o600)
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory

    # -- hosts -------------------------------------------------------------------------------

    def add(self, name: str, **hostvars) -> FakeHost:
        """Start one fake host and wait until it answers over SSH."""
        netns = f"{self.prefix}-{len(self.hosts)}"
        host = FakeHost(name=name, netns=netns, dir=self.workdir / "hosts" / name, hostvars=hostvars)
        for sub in PRIVATE_DIRS.values():
            (host.dir / sub).mkdir(parents=True, exist_ok=True)
        self.hosts.append(host)
        kill_netns(netns)  # a namespace of ours left behind by an interrupted run
        (host.dir / "sshd_config").write_text(self._sshd_config(host))
        _run([SSHD, "-t", "-f", str(host.dir / "sshd_config")])
        _run(["ip", "netns", "add", netns])
        _run(["ip", "netns", "exec", netns, "ip", "link", "set", "lo", "up"])
        mounts = "; ".join(f"mount --bind {host.dir / sub} {target}" for target, sub in PRIVATE_DIRS.items())
        script = f"set -e; hostname {netns}; {mounts}; exec {SSHD} -f {host.dir / 'sshd_config'} -E {host.dir / 'sshd.log'}"
        # sshd daemonizes: the command returns once it listens, and the daemon keeps the namespaces.
        _run(
            [
                "ip",
                "netns",
                "exec",
                netns,
                "unshare",
                "--mount",
                "--uts",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
            ]
        )
        with self.known_hosts.open("a") as kh:
            kh.write(f"{netns} {' '.join(Path(f'{self.host_key}.pub').read_text().split()[:2])}\n")
        self._wait_ready(host)
        return host

    def add_external(self, name: str, netns: str, host_key: str, **hostvars) -> FakeHost:
        """A host whose sshd runs elsewhere (e.g. inside a systemd-nspawn container) in network
        namespace `netns`, with host key `host_key` ("ssh-ed25519 AAAA..."); this fleet's client key
        must be in its root's authorized_keys. Its namespace and processes are not this fleet's to stop."""
        host = FakeHost(name=name, netns=netns, dir=self.workdir / "hosts" / name, hostvars=hostvars)
        host.dir.mkdir(parents=True, exist_ok=True)
        with self.known_hosts.open("a") as kh:
            kh.write(f"{netns} {' '.join(host_key.split()[:2])}\n")
        self._wait_ready(host)
        self.external.append(host)
        return host

    def _sshd_config(self, host: FakeHost) -> str:
        return "\n".join(
            [
                "Port 22",
                "ListenAddress 127.0.0.1",
                f"HostKey {self.host_key}",
                f"PidFile {host.dir / 'sshd.pid'}",
                f"AuthorizedKeysFile {self.authorized_keys}",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                # the key files sit under the test's temporary directory, whose modes sshd would reject
                "StrictModes no",
                # Ansible opens many sessions at once over its multiplexed connections
                "MaxStartups 100",
                "MaxSessions 100",
                "Subsystem sftp internal-sftp",
                "",
            ]
        )

    def _wait_ready(self, host: FakeHost, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            done = subprocess.run(self.ssh_argv(host) + ["hostname"], capture_output=True, text=True)
            if done.returncode == 0 and done.stdout.strip() == host.netns:
                return
            if time.monotonic() > deadline:
                log = (host.dir / "sshd.log").read_text() if (host.dir / "sshd.log").exists() else ""
                raise FleetError(f"fake host {host.name} did not answer over SSH: {done.stderr}\n{log}")
            time.sleep(0.2)

    # -- talking to hosts --------------------------------------------------------------------

    def ssh_common_args(self, host: FakeHost) -> list[str]:
        return [
            "-o",
            f"UserKnownHostsFile={self.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"ProxyCommand=ip netns exec {host.netns} nc 127.0.0.1 22",
        ]

    def ssh_argv(self, host: FakeHost) -> list[str]:
        return [
            "ssh",
            "-i",
            str(self.client_key),
            "-o",
            "BatchMode=yes",
            *self.ssh_common_args(host),
            f"root@{host.netns}",
        ]

    def ssh(self, host: FakeHost, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run a shell command on the fake host (inside its namespaces), for assertions."""
        return subprocess.run(
            self.ssh_argv(host) + [command], capture_output=True, text=True, timeout=timeout
        )

    def connection_vars(self, host: FakeHost) -> dict:
        common = (
            f"-o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes "
            f'-o ProxyCommand="ip netns exec {host.netns} nc 127.0.0.1 22"'
        )
        return {
            "ansible_host": host.netns,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.client_key),
            "ansible_ssh_common_args": common,
            "ansible_python_interpreter": TARGET_PYTHON,
        }

    def write_inventory(
        self,
        path: Path,
        group: str = "rocmdoctor_hosts",
        group_vars: dict | None = None,
        extra_hosts: dict[str, dict] | None = None,
    ) -> Path:
        """A YAML inventory (JSON is YAML) with every fake host plus `extra_hosts` (name -> vars)."""
        hosts = {h.name: {**self.connection_vars(h), **h.hostvars} for h in self.hosts + self.external}
        hosts.update(extra_hosts or {})
        inventory = {"all": {"children": {group: {"hosts": hosts, "vars": group_vars or {}}}}}
        path = Path(path)
        path.write_text(json.dumps(inventory, indent=2) + "\n")
        return path

    def ansible_env(self) -> dict[str, str]:
        """Environment for ansible-playbook: this fleet's short ControlPath directory, no host keys asked."""
        return {
            **os.environ,
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.control_dir),
            "ANSIBLE_LOCAL_TEMP": str(self.workdir / "ansible-tmp"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
        }

    # -- teardown ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop exactly this fleet's sshds (and whatever they started) and delete its namespaces."""
        for host in self.hosts:
            pid = host.sshd_pid()
            if pid and _alive(pid) and pid in netns_pids(host.netns):
                os.kill(pid, signal.SIGTERM)
            kill_netns(host.netns)
        shutil.rmtree(self.control_dir, ignore_errors=True)

    def __enter__(self) -> SshFleet:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- running the playbooks -----------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
PLAYBOOKS = REPO / "playbooks"
ANSIBLE_PLAYBOOK = Path(os.environ.get("VIRTUAL_ENV") or REPO / ".venv") / "bin" / "ansible-playbook"
_RECAP = re.compile(
    r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)", re.MULTILINE
)


@dataclass
class PlaybookRun:
    rc: int
    stdout: str
    stderr: str
    seconds: float

    def recap(self) -> dict[str, dict[str, int]]:
        """PLAY RECAP per host: {"host": {"ok": n, "changed": n, "unreachable": n, "failed": n, "skipped": n}}."""
        keys = ("ok", "changed", "unreachable", "failed", "skipped")
        return {
            m.group(1): dict(zip(keys, map(int, m.groups()[1:]), strict=True))
            for m in _RECAP.finditer(self.stdout)
        }


def run_playbook(
    fleet: SshFleet, inventory: Path, *args: str, timeout: float = 1200, playbook: str = "site.yml"
) -> PlaybookRun:
    """The real ansible-playbook on playbooks/site.yml (or `playbook`), from playbooks/ (its ansible.cfg applies)."""
    started = time.monotonic()
    done = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", str(inventory), playbook, *args],
        cwd=PLAYBOOKS,
        env=fleet.ansible_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return PlaybookRun(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def host_root(fixture_id: str, dest: Path) -> Path:
    """A private copy of a host fixture: `rocmdoctor unit --write --root` writes the unit and the
    service account into the root it was given, so every fake host needs its own."""
    from harness.hosts import fixture_root

    shutil.copytree(fixture_root(fixture_id), dest, symlinks=True)
    return dest
