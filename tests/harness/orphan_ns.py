"""Run as PID 1 of a new PID namespace (`unshare --pid --fork --mount-proc`), so that every process it
starts has PID 1 as its parent, as an orphan has, and every one of them dies with it (the kernel kills
a namespace whose init exits). It writes what happened as JSON to OUT.

    orphan_ns.py fix OUT VLLM_PYTHON MODEL PORT -- ROCMDOCTOR_ARGV...
        decoys (a log follower, a watcher naming vLLM in its arguments, scripts whose arguments name
        vLLM's entry module, a `VLLM::EngineCore` title on a program that is not vLLM, a script named
        vllm that is not vLLM's) beside real vLLM API servers (`python -m vllm.entrypoints...`, the
        `vllm` console script); then ROCMDOCTOR_ARGV + `--check --json` and `--yes --json`.
    orphan_ns.py reuse OUT VLLM_PYTHON MODEL PORT
        a real vLLM server held (host_processes.hold_vllm_orphans), killed, its PID given to a new
        process (ns_last_pid), then stop_held: the newcomer must not be signalled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

DECOY_SCRIPT = "import time\ntime.sleep(600)\n"
# The executable each decoy ends up running, by the first word of its name (sh is dash on Debian).
EXES = {"tail": ("tail",), "watcher": ("sh", "dash", "bash"), "sleep": ("sleep",)}


def exe_is(pid: int, name: str | tuple[str, ...], timeout: float = 60.0) -> None:
    """Wait until `pid` runs an executable whose name starts with `name` (its exec happened)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith(name):
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"pid {pid} never ran {name}")


def quiet(argv: list[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kwargs
    )


def engine(python: str, model: str, port: int, console: bool = False) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    if console:
        argv = [str(Path(python).parent / "vllm"), "serve", model, "--port", str(port)]
    else:
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--port", str(port)]
    started = quiet(argv, env=env)
    # The forked child runs this harness's own python until its exec: wait for the server's argv too.
    exe_is(started.pid, "python")
    argv_is(started.pid, argv)
    return started


def argv_is(pid: int, argv: list[str], timeout: float = 60.0) -> None:
    """Wait until `pid`'s command line ends with argv[1:] (a console script's runs under its interpreter)."""
    want = [a.encode() for a in argv[1:]]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
            if words[-len(want) :] == want:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"pid {pid} never ran {argv[:3]}")


def decoys(work: Path) -> dict[str, subprocess.Popen]:
    script = work / "watch.py"
    script.write_text(DECOY_SCRIPT)
    named = work / "bin" / "vllm"
    named.parent.mkdir(exist_ok=True)
    named.write_text(DECOY_SCRIPT)
    python = sys.executable
    started = {
        "tail -F /var/log/vllm": quiet(["tail", "-F", "/var/log/vllm"]),
        "watcher with pgrep -f VLLM": quiet(["sh", "-c", "while sleep 1; do pgrep -f VLLM >/dev/null; done"]),
        "script --match vllm.entrypoint": quiet([python, str(script), "--match", "vllm.entrypoint"]),
        "python -c ... -m vllm.entrypoints": quiet(
            [python, "-c", DECOY_SCRIPT, "-m", "vllm.entrypoints.openai.api_server"]
        ),
        "sleep titled VLLM::EngineCore": quiet(["bash", "-c", "exec -a VLLM::EngineCore sleep 600"]),
        "python titled VLLM::EngineCore": quiet(
            ["bash", "-c", f"exec -a VLLM::EngineCore {python} -c '{DECOY_SCRIPT}'"]
        ),
        "a script named vllm": quiet([python, str(named), "serve", "x"]),
    }
    for name, proc in started.items():
        exe_is(proc.pid, EXES.get(name.split()[0], ("python",)))
    return started


def run_json(argv: list[str]) -> dict:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    try:
        return {"rc": done.returncode, "out": json.loads(done.stdout), "stderr": done.stderr[-2000:]}
    except ValueError:
        return {
            "rc": done.returncode,
            "out": None,
            "stdout": done.stdout[-2000:],
            "stderr": done.stderr[-2000:],
        }


def fix_mode(out: Path, python: str, model: str, port: int, rocmdoctor: list[str]) -> dict:
    fakes = decoys(out.parent)
    real = {
        "python -m vllm.entrypoints.openai.api_server": engine(python, model, port),
        "vllm serve (console script)": engine(python, model, port + 1, console=True),
    }
    check = run_json([*rocmdoctor, "--check", "--json"])
    applied = run_json([*rocmdoctor, "--yes", "--json"])
    time.sleep(0.5)
    return {
        "decoys": {name: {"pid": p.pid, "alive": p.poll() is None} for name, p in fakes.items()},
        "engines": {
            name: {"pid": p.pid, "alive": p.poll() is None, "rc": p.returncode} for name, p in real.items()
        },
        "check": check,
        "yes": applied,
    }


def reuse_mode(out: Path, python: str, model: str, port: int) -> dict:
    from rocmdoctor.host_processes import hold_vllm_orphans, stop_held

    result = {}
    for newcomer in ("sleep", "vllm"):
        first = engine(python, model, port)
        held, _notes = hold_vllm_orphans({0})
        judged = [h.pid for h in held]
        first.kill()
        first.wait()
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(first.pid - 1))
        if newcomer == "sleep":
            second = quiet(["sleep", "600"])
            exe_is(second.pid, "sleep")
        else:
            second = engine(python, model, port + 1)
        ended = stop_held(held)
        time.sleep(0.5)
        result[newcomer] = {
            "judged": judged,
            "first": first.pid,
            "second": second.pid,
            "ended": {str(k): v for k, v in ended.items()},
            "second_alive": second.poll() is None,
        }
        second.send_signal(signal.SIGKILL)
        second.wait()
    return result


def main() -> None:
    mode, out, python, model, port = sys.argv[1:6]
    path = Path(out)
    if mode == "fix":
        result = fix_mode(path, python, model, int(port), sys.argv[7:])
    else:
        result = reuse_mode(path, python, model, int(port))
    path.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
