"""A systemd-nspawn container with sshd, reached by an SshFleet as host `node`: the real systemd and
real SSH the fleet tests converge. Test-only unit drop-ins go in before the playbook runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.fleet import SshFleet
from harness.nspawn import Bind, Machine, boot

# What a GPU-less container fails; everything else must pass.
NO_GPU_CHECKS = ["gpu.present", "gpu.arch", "driver.loaded", "kernel.cwsr", "memory.gpu", "access.devices"]


@contextmanager
def ssh_systemd_host(
    name: str, workdir: Path, binds: list[Bind], dropins: dict[str, str]
) -> Iterator[tuple[SshFleet, Machine]]:
    """The booted container and its fleet; `dropins` maps a unit name (`vllm.service`) to the text of
    its test drop-in. The container is stopped on every way out."""
    machine = boot(name, netns=name, binds=binds, log_dir=workdir)
    try:
        with SshFleet(name, workdir) as fleet:
            machine.run(
                "mkdir -p -m 0700 /root/.ssh && cat > /root/.ssh/authorized_keys",
                input=Path(f"{fleet.client_key}.pub").read_text(),
            )
            machine.run("ssh-keygen -A && systemctl start ssh")
            for unit, text in dropins.items():
                folder = f"/etc/systemd/system/{unit}.d"
                machine.run(f"mkdir -p {folder} && cat > {folder}/50-test.conf", input=text)
            host_key = machine.run(["cat", "/etc/ssh/ssh_host_ed25519_key.pub"]).stdout
            fleet.add_external("node", name, host_key)
            yield fleet, machine
    finally:
        machine.stop()
