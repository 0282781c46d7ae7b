"""A host for `rocmdoctor upgrade` without systemd or a GPU: a `systemctl` on PATH that restarts a
"unit" the way the unit `rocmdoctor unit` writes does: stop the old process group, start
`<prefix>/current/bin/vllm-server` with the unit's arguments, and return once /health answers (the
unit's ExecStartPost, wait_ready). It records which bundle each start ran (`<lab>/<unit>.bundle`), so a
test asks what the server really runs.

The server is whatever the bundle's launcher runs: the protocol double (`harness.fake_openai`, with the
bundle's own switches, `server_script`) for the stand-in tests, or the real vLLM CPU engine
(`harness.bundles.vllm_test_bundle`, with `UpgradeLab.configure`'s arguments and environment) for the
engine tests over SSH, where `NetnsBridge` lets a host in its own network namespace reach the release
server on this machine's loopback.

systemd itself runs in systemd-nspawn (tests/system); here the point is the upgrade's decisions.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

HARNESS_PARENT = Path(__file__).resolve().parent.parent

SYSTEMCTL = r'''#!{python}
"""systemctl restart UNIT for the upgrade tests (harness/upgrade_lab.py)."""
import json, os, signal, subprocess, sys, time, urllib.request
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
    for _ in range(400):  # vLLM stops its engine core before it exits
        os.killpg(pid, 0)
        time.sleep(0.05)
    os.killpg(pid, signal.SIGKILL)
except (OSError, ValueError):
    pass
# A unit's own prefix (several hosts' units in one lab), else the lab's.
prefix_file = f"{{lab}}/{{unit}}.prefix"
prefix = open(prefix_file).read() if os.path.exists(prefix_file) else os.environ["UPGRADE_PREFIX"]
# The unit's ExecStart arguments and Environment= (UpgradeLab.configure), else the double's port.
args_file, env_file = f"{{lab}}/{{unit}}.args.json", f"{{lab}}/{{unit}}.env.json"
args = json.load(open(args_file)) if os.path.exists(args_file) else ["--port", port]
env = {{**os.environ, **(json.load(open(env_file)) if os.path.exists(env_file) else {{}})}}
ready_s = float(open(f"{{lab}}/{{unit}}.ready_s").read()) if os.path.exists(f"{{lab}}/{{unit}}.ready_s") else 30.0
out = open(f"{{lab}}/{{unit}}.log", "ab")
proc = subprocess.Popen([f"{{prefix}}/current/bin/vllm-server", *args],
                        stdout=out, stderr=out, env=env, start_new_session=True)
open(f"{{lab}}/{{unit}}.pid", "w").write(str(proc.pid))
open(f"{{lab}}/{{unit}}.bundle", "w").write(os.path.basename(os.readlink(f"{{prefix}}/current")))
deadline = time.monotonic() + ready_s
while time.monotonic() < deadline and proc.poll() is None:
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{{port}}/health", timeout=2).status == 200:
            sys.exit(0)
    except OSError:
        time.sleep(0.2)
sys.exit(f"{{unit}} did not become ready (exit status {{proc.poll()}})")
'''


LOAD_BALANCER = r'''#!{python}
"""A load balancer's hook for the upgrade tests: takes POST {{"unit", "state"}} (docs/fleet.md) and
logs "lb UNIT STATE" into the lab's systemctl.log, so a test sees it in order with the restarts;
answers 503 while <lab>/lb.refuse exists (a balancer that cannot take the change)."""
import http.server, json, os, sys
lab, port = sys.argv[1], int(sys.argv[2])

class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        refuse = os.path.exists(f"{{lab}}/lb.refuse")
        if not refuse:
            with open(f"{{lab}}/systemctl.log", "a") as log:
                log.write(f"lb {{body['unit']}} {{body['state']}} {{self.path}}\n")
        self.send_response(503 if refuse else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Hook).serve_forever()
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

    def configure(
        self, unit: str, port: int, args: list[str], env: dict[str, str], ready_s: float, prefix: str
    ) -> None:
        """The unit as its unit file would say: ExecStart's arguments after the launcher, its
        Environment=, how long its readiness wait lasts, the prefix whose `current` it runs."""
        (self.lab / f"{unit}.port").write_text(str(port))
        (self.lab / f"{unit}.args.json").write_text(json.dumps(args))
        (self.lab / f"{unit}.env.json").write_text(json.dumps(env))
        (self.lab / f"{unit}.ready_s").write_text(str(ready_s))
        (self.lab / f"{unit}.prefix").write_text(prefix)

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

    def load_balancer(self, port: int) -> str:
        """Start the load balancer's hook (a process of its own, on `port`); its URL for this host."""
        import subprocess
        import urllib.error
        import urllib.request

        script = self.bin / "load-balancer"
        script.write_text(LOAD_BALANCER.format(python=sys.executable))
        script.chmod(0o755)
        process = subprocess.Popen([str(script), str(self.lab), str(port)], start_new_session=True)
        (self.lab / "load-balancer.pid").write_text(str(process.pid))
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1)
            except urllib.error.HTTPError:
                break  # it answers (GET is not its method)
            except OSError:
                time.sleep(0.05)
        return f"http://127.0.0.1:{port}/backends/this-host"

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


CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class NetnsBridge:
    """127.0.0.1:PORT inside network namespace `netns` forwarded to the same port on this machine's
    loopback, so the URLs a loopback server hands out (the release server's asset links) work
    unchanged on a fake host. The listening socket is made inside the namespace (setns on this
    thread only, then back); every forwarded connection is opened from this machine's namespace."""

    def __init__(self, netns: str, port: int) -> None:
        self.port = port
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        try:
            _setns(target)
            try:
                self.listener = socket.create_server(("127.0.0.1", port))
            finally:
                _setns(own)
        finally:
            os.close(own)
            os.close(target)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                inside, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                outside = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            except OSError:
                inside.close()
                continue
            outside.settimeout(None)
            for a, b in ((inside, outside), (outside, inside)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()
