"""A host for `rocmdoctor upgrade` without systemd or a GPU: bundles whose server is the protocol double
(`harness.fake_openai`, started with the bundle's own switches: a good bundle, one that fails smoke,
one that streams slower), and a `systemctl` on PATH that restarts a "unit" the way the unit
`rocmdoctor unit` writes does: stop the old process group, start `<prefix>/current/bin/vllm-server
--port P`, and return once /health answers (the unit's ExecStartPost, wait_ready). It records which
bundle each start ran (`<lab>/<unit>.bundle`), so a test asks what the server really runs.

systemd itself runs in systemd-nspawn (tests/system); here the point is the upgrade's decisions.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

HARNESS_PARENT = Path(__file__).resolve().parent.parent

SYSTEMCTL = r'''#!{python}
"""systemctl restart UNIT for the upgrade tests (harness/upgrade_lab.py)."""
import os, signal, subprocess, sys, time, urllib.request
lab = os.environ["UPGRADE_LAB"]
if sys.argv[1:2] != ["restart"] or len(sys.argv) != 3:
    sys.exit("only `systemctl restart UNIT` is doubled here")
unit = sys.argv[2]
port = open(f"{{lab}}/{{unit}}.port").read().strip()
with open(f"{{lab}}/systemctl.log", "a") as log:
    log.write(f"restart {{unit}}\n")
try:
    pid = int(open(f"{{lab}}/{{unit}}.pid").read())
    os.killpg(pid, signal.SIGTERM)
    for _ in range(100):
        os.killpg(pid, 0)
        time.sleep(0.05)
    os.killpg(pid, signal.SIGKILL)
except (OSError, ValueError):
    pass
# A unit's own prefix (several hosts' units in one lab), else the lab's.
prefix_file = f"{{lab}}/{{unit}}.prefix"
prefix = open(prefix_file).read() if os.path.exists(prefix_file) else os.environ["UPGRADE_PREFIX"]
out = open(f"{{lab}}/{{unit}}.log", "ab")
proc = subprocess.Popen([f"{{prefix}}/current/bin/vllm-server", "--port", port],
                        stdout=out, stderr=out, start_new_session=True)
open(f"{{lab}}/{{unit}}.pid", "w").write(str(proc.pid))
open(f"{{lab}}/{{unit}}.bundle", "w").write(os.path.basename(os.readlink(f"{{prefix}}/current")))
for _ in range(300):
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{{port}}/health", timeout=2).status == 200:
            sys.exit(0)
    except OSError:
        time.sleep(0.1)
sys.exit(f"{{unit}} did not become ready")
'''


def server_script(*fake_args: str) -> bytes:
    """A bundle's `bin/vllm-server`: the protocol double on the port it is given, with these switches."""
    return (
        f"#!{sys.executable}\n"
        "import os, sys\n"
        "argv = sys.argv[1:]\n"
        "port = argv[argv.index('--port') + 1]\n"
        f"os.chdir({str(HARNESS_PARENT)!r})\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'harness.fake_openai', '--port', port,\n"
        f"          '--served-name', 'tiny', *{list(fake_args)!r}])\n"
    ).encode()


class UpgradeLab:
    def __init__(self, lab: Path, prefix: Path) -> None:
        self.lab, self.prefix = lab, prefix
        self.bin = lab / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        systemctl = self.bin / "systemctl"
        systemctl.write_text(SYSTEMCTL.format(python=sys.executable))
        systemctl.chmod(0o755)

    def env(self) -> dict[str, str]:
        return {
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "UPGRADE_LAB": str(self.lab),
            "UPGRADE_PREFIX": str(self.prefix),
        }

    def start(self, unit: str, port: int, prefix: Path | None = None) -> str:
        """Start the unit on the current bundle of its prefix (as `systemctl start` would); its URL."""
        import subprocess

        (self.lab / f"{unit}.port").write_text(str(port))
        if prefix is not None:
            (self.lab / f"{unit}.prefix").write_text(str(prefix))
        done = subprocess.run(
            [str(self.bin / "systemctl"), "restart", unit],
            env={**os.environ, **self.env()},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return f"http://127.0.0.1:{port}"

    @staticmethod
    def in_flight(url: str) -> float:
        """vllm:num_requests_running as the double exports it."""
        import re
        import urllib.request

        text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
        found = re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    def running(self, unit: str) -> str:
        """The bundle the unit's server was started from."""
        return (self.lab / f"{unit}.bundle").read_text()

    def restarts(self) -> list[str]:
        log = self.lab / "systemctl.log"
        return log.read_text().splitlines() if log.exists() else []

    def stop_all(self) -> None:
        for pid_file in self.lab.glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        time.sleep(0.1)
