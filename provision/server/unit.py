"""The systemd unit that runs the vLLM server, its environment file, and writing them like Ansible.

`render()` is pure: paths and arguments in, file contents out. `write()` makes the host match:
each file is replaced atomically only when its content or mode differs, a diff is kept for the
report, the service account and its groups are created when missing, and `systemctl daemon-reload`
runs only where systemd is PID 1 and only when the unit changed.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from rocmdoctor.host_files import is_dir, shipped_text
from rocmdoctor.host_writes import HostWriter, WriteRefused
from rocmdoctor.model import Change
from rocmdoctor.params import MAX_DURATION_S, prefix_problem, service_user_problem
from rocmdoctor.provision.server import unit_syntax
from rocmdoctor.provision.server.args import ServerArgs
from rocmdoctor.provision.server.jit_cache import ENV_FILE as JIT_ENV_FILE
from rocmdoctor.provision.server.unit_syntax import PLACEHOLDER as PLACEHOLDER
from rocmdoctor.provision.server.unit_syntax import UnitError as UnitError
from rocmdoctor.registry import DEFAULT_PREFIX
from rocmdoctor.sensitive import KeyFileError
from rocmdoctor.sensitive import read_api_key as read_key_file
from rocmdoctor.vllm.environment import BUNDLE_SETTINGS

UNIT_NAME = "vllm.service"
STATE_NAME = "vllm"
ENV_FILE = "/etc/rocmdoctor/vllm.env"
UNIT_DIR = "/etc/systemd/system"
DEFAULT_LOAD_TIMEOUT_S = 1800
# Groups that own /dev/kfd and /dev/dri/renderD* on ROCm hosts. Minimal Debian has no `render`
# (udev creates it with the GPU), and a missing group fails the unit with status 216/GROUP.
DEVICE_GROUPS = ("render", "video")
# A key the server is started with: long enough not to be guessed (the reader's rule, with this minimum).
MIN_SERVER_KEY_LENGTH = 8
# uids that must not run the server whatever they are called: root, and nobody (65534).
FORBIDDEN_UIDS = {0: "root", 65534: "nobody"}


@dataclass(frozen=True, slots=True)
class ServiceLayout:
    """Where things live on the target (host paths, without --root)."""

    prefix: str = DEFAULT_PREFIX
    unit_dir: str = UNIT_DIR
    env_file: str = ENV_FILE

    def __post_init__(self) -> None:
        # The prefix is the first word of ExecStart=: "+/opt/rd" would run vLLM as root, unsandboxed.
        problem = prefix_problem(self.prefix)
        if problem:
            raise UnitError(f"--prefix {self.prefix!r}: {problem}")

    @property
    def server(self) -> str:
        return f"{self.prefix}/current/bin/vllm-server"

    @property
    def python(self) -> str:
        return f"{self.prefix}/current/bin/python3"

    @property
    def wait_ready(self) -> str:
        return f"{self.prefix}/libexec/wait-ready"

    @property
    def stop_leftovers(self) -> str:
        return f"{self.prefix}/libexec/stop-leftovers"

    @property
    def unit_path(self) -> str:
        return f"{self.unit_dir}/{UNIT_NAME}"


@dataclass(frozen=True, slots=True)
class FileSpec:
    path: str  # host path
    content: str
    mode: int
    secret: bool = False  # the diff of a secret file is never shown


@dataclass
class FileChange:
    path: str
    changed: bool
    diff: str = ""

    def to_json(self) -> dict:
        return {"path": self.path, "changed": self.changed, "diff": self.diff}


class FileResult(Protocol):
    path: str
    diff: str

    @property
    def changed(self) -> bool: ...

    def to_json(self) -> dict: ...


F = TypeVar("F", bound=FileResult)


@dataclass
class WriteReport(Generic[F]):
    """What a write did to the host: its files (one result type per command), the accounts it
    created, whether systemd was reloaded. `instances` extends it."""

    files: list[F] = field(default_factory=list)
    accounts: list[str] = field(default_factory=list)  # what was created
    daemon_reload: str = "not needed"
    check: bool = False  # a dry run: what a write would do

    @property
    def changed(self) -> bool:
        return bool(self.accounts) or any(f.changed for f in self.files)

    def summary(self) -> str:
        if not self.changed:
            return "nothing to change"
        files = sum(1 for f in self.files if f.changed)
        parts = (
            [f"{'would change' if self.check else 'changed'} {files} file{'s' * (files != 1)}"]
            if files
            else []
        )
        if self.accounts:
            parts.append(f"{'would create' if self.check else 'created'} {', '.join(self.accounts)}")
        return "; ".join(parts)

    def change(self) -> Change:
        """The one Change: the files' unified diffs, and the write's own fields."""
        return Change(
            self.changed,
            self.summary(),
            "".join(
                f.diff if f.diff.endswith("\n") else f.diff + "\n" for f in self.files if f.changed and f.diff
            ),
            {
                "check": self.check,
                "files": [f.to_json() for f in self.files],
                "accounts_created": self.accounts,
                "daemon_reload": self.daemon_reload,
            },
        )

    def to_json(self) -> dict:
        return self.change().envelope()


def systemd_quote(word: str) -> str:
    """One argv word for ExecStart= (unit_syntax.exec_word: the one writer of unit syntax)."""
    return unit_syntax.exec_word(word)


def command_line(argv: list[str]) -> str:
    return unit_syntax.command_line(list(argv))


def readiness_url(args: ServerArgs) -> str:
    host = args.host
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{args.port}"


def read_api_key(path: Path) -> str:
    """The key the server is started with (the one reader's rule, at least MIN_SERVER_KEY_LENGTH long)."""
    try:
        return read_key_file(path, min_length=MIN_SERVER_KEY_LENGTH)
    except KeyFileError as exc:
        raise UnitError(str(exc)) from None


def ready_gate_argv(args: ServerArgs, layout: ServiceLayout, timeout_s: int) -> list[str]:
    """The unit's readiness gate (ExecStartPost): the bundle's Python waits for a real completion."""
    return [layout.python, layout.wait_ready, readiness_url(args), args.served_model_name, str(timeout_s)]


def stop_leftovers_argv(layout: ServiceLayout) -> str:
    """The unit's ExecStartPre: `%n` is systemd's name of the unit (the script acts only in its group)."""
    return unit_syntax.command_line([layout.python, layout.stop_leftovers, unit_syntax.Verbatim("%n")])


def _environment_line(settings: dict[str, str]) -> str:
    return unit_syntax.environment(settings).text


LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
# A server with one of these talks to other machines (a cluster's head or worker): never fenced.
PEER_FLAGS = (
    "--nnodes",
    "--master-addr",
    "--data-parallel-address",
    "--headless",
    "--distributed-executor-backend",
)


def ip_fence(host: str, argv: list[str]) -> dict[str, unit_syntax.Field]:
    """IPAddressAllow=/IPAddressDeny= of a server: loopback only when it binds loopback, its model is a
    local path (`--model /...`: nothing to download from a hub) and it has no peers; empty otherwise."""
    model = next((argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "--model"), "")
    local = host in LOOPBACK_HOSTS and model.startswith("/") and not any(w in PEER_FLAGS for w in argv)
    return {
        "ip_allow": unit_syntax.Field("localhost" if local else ""),
        "ip_deny": unit_syntax.Field("any" if local else ""),
    }


def render_unit(
    args: ServerArgs,
    layout: ServiceLayout,
    user: str,
    timeout_s: int = DEFAULT_LOAD_TIMEOUT_S,
    *,
    unit_name: str = UNIT_NAME,
    server: list[str] | None = None,
    ready_gate: bool = True,
    description: str | None = None,
) -> str:
    """The unit of one server. A cluster's headless worker (provision/server/cluster_unit.py) is another
    unit name, another program before the vLLM arguments, and no readiness gate of its own (it serves
    no HTTP: the head's gate passes only once every worker joined)."""
    problem = service_user_problem(user)
    if problem:
        raise UnitError(f"--user {user!r}: {problem}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int) or not 1 <= timeout_s <= MAX_DURATION_S:
        # TimeoutStartSec must be a real bound: never negative, huge or missing.
        raise UnitError(f"--timeout {timeout_s!r}: give whole seconds from 1 to {MAX_DURATION_S}")
    fields = {
        "unit_name": unit_syntax.name(unit_name, "unit name"),
        "description": unit_syntax.text(description or args.served_model_name, "the description"),
        "user": unit_syntax.name(user, "--user"),
        "state_name": unit_syntax.name(STATE_NAME, "state directory"),
        "bundle_environment": unit_syntax.environment({**BUNDLE_SETTINGS, **args.environment}),
        "env_file": unit_syntax.path(layout.env_file, "--env-file"),
        "jit_env_file": unit_syntax.path(f"{layout.prefix}/current/{JIT_ENV_FILE}", "--prefix"),
        "exec_start_pre": unit_syntax.Field(stop_leftovers_argv(layout)),
        "exec_start": unit_syntax.command([*(server or [layout.server]), *args.argv()]),
        # an empty ExecStartPost= is systemd's "no such command" (it resets the list)
        "exec_start_post": unit_syntax.command(
            list(ready_gate_argv(args, layout, timeout_s)) if ready_gate else []
        ),
        # The readiness wait gives up first, so its message (not systemd's timeout) is in the journal.
        "timeout_start_s": unit_syntax.number(timeout_s + 60),
        **ip_fence(args.host, args.argv()),
    }
    template = shipped_text("rocmdoctor.provision.server", "templates/vllm.service")
    return unit_syntax.render(template, fields, "templates/vllm.service")


def render_env(api_key: str | None) -> str:
    lines = ["# Written by `rocmdoctor unit --write`: secrets for vllm.service (mode 0600, root only)."]
    if api_key:
        lines.append(f"VLLM_API_KEY={api_key}")
    return "\n".join(lines) + "\n"


def helper_specs(layout: ServiceLayout) -> list[FileSpec]:
    """The unit's own programs in <prefix>/libexec, standard library only (the bundle's python runs them):
    the readiness gate (ExecStartPost) and the leftover stop (ExecStartPre)."""
    return [
        FileSpec(layout.wait_ready, shipped_text("rocmdoctor.provision.server", "wait_ready.py"), 0o755),
        FileSpec(
            layout.stop_leftovers, shipped_text("rocmdoctor.provision.server", "stop_leftovers.py"), 0o755
        ),
    ]


def file_specs(
    args: ServerArgs,
    layout: ServiceLayout,
    user: str,
    api_key: str | None,
    timeout_s: int = DEFAULT_LOAD_TIMEOUT_S,
) -> list[FileSpec]:
    return [
        FileSpec(layout.unit_path, render_unit(args, layout, user, timeout_s), 0o644),
        FileSpec(layout.env_file, render_env(api_key), 0o600, secret=True),
        *helper_specs(layout),
        *health_specs(layout, user),
    ]


def health_specs(layout: ServiceLayout, user: str) -> list[FileSpec]:
    """rocmdoctor-health.service and .timer (provision/server/health_unit.py), written with every server
    unit; the service runs as the servers' user."""
    from rocmdoctor.provision.server.health_unit import health_units

    return [
        FileSpec(path, content, 0o644)
        for path, content in health_units(layout.prefix, layout.unit_dir, command_line, user=user)
    ]


def apply_file(writer: HostWriter, spec: FileSpec) -> FileChange:
    """Make spec.path hold spec.content with spec.mode; inside a foreign root no link is followed."""
    raw = writer.read_current(spec.path)
    old_mode = writer.current_mode(spec.path)
    old = raw.decode(errors="replace") if raw is not None else None
    if old == spec.content:
        if old_mode != spec.mode:
            writer.chmod(spec.path, spec.mode)
            return FileChange(spec.path, True, f"mode {old_mode:04o} -> {spec.mode:04o}")
        return FileChange(spec.path, False)
    if spec.secret:
        diff = f"{spec.path}: content changed (secret, not shown)"
    else:
        diff = "".join(
            difflib.unified_diff(
                (old or "").splitlines(True),
                spec.content.splitlines(True),
                fromfile=spec.path if old is not None else "/dev/null",
                tofile=spec.path,
            )
        )
    writer.write_file(spec.path, spec.content.encode(), spec.mode)
    return FileChange(spec.path, True, diff)


def ensure_accounts(writer: HostWriter, user: str) -> list[str]:
    """The service user (system account, own group, no login) and the device groups, if missing.

    On a foreign root the account files are edited by rocmdoctor itself (nothing from the tree runs)."""
    uid = writer.uid_of(user)
    if uid in FORBIDDEN_UIDS:
        raise UnitError(
            f"--user {user} has uid {uid} ({FORBIDDEN_UIDS[uid]}) in {writer.root}/etc/passwd; "
            "the server must run as a dedicated unprivileged account such as vllm"
        )
    created = []
    for group in DEVICE_GROUPS:
        if group not in writer.group_names():
            writer.add_group(group)
            created.append(f"group {group}")
    if uid is None or not writer.account_complete(user):  # a killed run's partial account is completed
        writer.add_system_user(user, f"/var/lib/{STATE_NAME}", "/usr/sbin/nologin", "vLLM server")
        created.append(f"user {user}")
    return created


def systemd_running(root: Path) -> bool:
    """systemd is PID 1 here (sd_booted's test); never true for another root."""
    return root == Path("/") and is_dir(Path("/run/systemd/system"))


def write(writer: HostWriter, specs: list[FileSpec], user: str) -> WriteReport[FileChange]:
    """Make the writer's tree match `specs`; a writer in check mode only reports (Ansible's --check)."""
    report: WriteReport[FileChange] = WriteReport(check=writer.check_mode)
    try:
        report.accounts = ensure_accounts(writer, user)
        report.files = [apply_file(writer, spec) for spec in specs]
        if any(f.changed and f.path.endswith(SYSTEMD_UNITS) for f in report.files):
            report.daemon_reload = daemon_reload(writer)
    except WriteRefused as exc:
        raise UnitError(str(exc)) from None
    return report


# Files systemd reads as units: a change to one needs a daemon-reload.
SYSTEMD_UNITS = (".service", ".target", ".timer")


def daemon_reload(writer: HostWriter) -> str:
    """systemd re-reads its units where it runs; what happened, for the report."""
    if writer.check_mode:
        return "would run"
    if not systemd_running(writer.root):
        return "skipped: systemd is not running here"
    writer.run(["systemctl", "daemon-reload"])
    return "done"
