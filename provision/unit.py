"""The systemd unit that runs the vLLM server, its environment file, and writing them like Ansible.

`render()` is pure: paths and arguments in, file contents out. `write()` makes the host match:
each file is replaced atomically only when its content or mode differs, a diff is kept for the
report, the service account and its groups are created when missing, and `systemctl daemon-reload`
runs only where systemd is PID 1 and only when the unit changed.
"""

from __future__ import annotations

import difflib
import re
import subprocess
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from ..atomic import write_atomic
from ..registry import DEFAULT_PREFIX
from .server_args import ServerArgs

UNIT_NAME = "vllm.service"
STATE_NAME = "vllm"
ENV_FILE = "/etc/rocmdoctor/vllm.env"
UNIT_DIR = "/etc/systemd/system"
DEFAULT_LOAD_TIMEOUT_S = 1800
# Groups that own /dev/kfd and /dev/dri/renderD* on ROCm hosts. Minimal Debian has no `render`
# (udev creates it with the GPU), and a missing group fails the unit with status 216/GROUP.
DEVICE_GROUPS = ("render", "video")
API_KEY_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]{8,512}")
PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")


class UnitError(ValueError):
    """A choice the unit cannot be written with; the message says what to do."""


@dataclass(frozen=True, slots=True)
class ServiceLayout:
    """Where things live on the target (host paths, without --root)."""

    prefix: str = DEFAULT_PREFIX
    unit_dir: str = UNIT_DIR
    env_file: str = ENV_FILE

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


@dataclass
class WriteReport:
    files: list[FileChange] = field(default_factory=list)
    accounts: list[str] = field(default_factory=list)  # what was created
    daemon_reload: str = "not needed"

    @property
    def changed(self) -> bool:
        return bool(self.accounts) or any(f.changed for f in self.files)

    def to_json(self) -> dict:
        return {"changed": self.changed, "files": [f.to_json() for f in self.files],
                "accounts_created": self.accounts, "daemon_reload": self.daemon_reload}


def systemd_quote(word: str) -> str:
    """One argv word for ExecStart=: systemd splits on spaces, unquotes, and expands $ and %."""
    if re.search(r"[\x00-\x1f\x7f]", word):
        raise UnitError(f"{word!r}: control characters (newlines, tabs) cannot go into a unit file")
    escaped = word.replace("%", "%%").replace("$", "$$")
    if escaped and not re.search(r"[\s\"'\\;]", escaped):
        return escaped
    return '"' + escaped.replace("\\", "\\\\").replace('"', '\\"') + '"'


def command_line(argv: list[str]) -> str:
    return " ".join(systemd_quote(word) for word in argv)


def readiness_url(args: ServerArgs) -> str:
    host = args.host
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{args.port}"


def read_api_key(path: Path) -> str:
    try:
        key = path.read_text().strip()
    except OSError as exc:
        raise UnitError(f"cannot read the API key file {path}: {exc.strerror}") from None
    if not API_KEY_PATTERN.fullmatch(key):
        raise UnitError(f"{path} must hold one key of 8-512 characters from A-Z a-z 0-9 . _ ~ + / = - "
                        "(e.g. `openssl rand -hex 32 > FILE`)")
    return key


def render_unit(args: ServerArgs, layout: ServiceLayout, user: str, timeout_s: int = DEFAULT_LOAD_TIMEOUT_S) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", user):
        raise UnitError(f"--user {user!r} is not a valid system user name (lower case, digits, - and _)")
    values = {
        "unit_name": UNIT_NAME,
        "description": args.served_model_name.replace("%", "%%"),
        "user": user,
        "state_name": STATE_NAME,
        "env_file": layout.env_file,
        "exec_start": command_line([layout.server, *args.argv()]),
        "exec_start_post": command_line([layout.python, layout.wait_ready, readiness_url(args),
                                         args.served_model_name, str(timeout_s)]),
        # The readiness wait gives up first, so its message (not systemd's timeout) is in the journal.
        "timeout_start_s": str(timeout_s + 60),
    }
    template = resources.files(__package__).joinpath("templates/vllm.service").read_text()
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def render_env(api_key: str | None) -> str:
    lines = ["# Written by `rocmdoctor unit --write`: secrets for vllm.service (mode 0600, root only)."]
    if api_key:
        lines.append(f"VLLM_API_KEY={api_key}")
    return "\n".join(lines) + "\n"


def wait_ready_script() -> str:
    return resources.files(__package__).joinpath("libexec/wait-ready").read_text()


def file_specs(args: ServerArgs, layout: ServiceLayout, user: str, api_key: str | None,
               timeout_s: int = DEFAULT_LOAD_TIMEOUT_S) -> list[FileSpec]:
    return [
        FileSpec(layout.unit_path, render_unit(args, layout, user, timeout_s), 0o644),
        FileSpec(layout.env_file, render_env(api_key), 0o600, secret=True),
        FileSpec(layout.wait_ready, wait_ready_script(), 0o755),
    ]


def _under(root: Path, host_path: str) -> Path:
    return root / host_path.lstrip("/")


def apply_file(root: Path, spec: FileSpec, check: bool = False) -> FileChange:
    real = _under(root, spec.path)
    try:
        old = real.read_text()
        old_mode = real.stat().st_mode & 0o7777
    except FileNotFoundError:
        old, old_mode = None, None
    if old == spec.content:
        if old_mode != spec.mode:
            if not check:
                real.chmod(spec.mode)
            return FileChange(spec.path, True, f"mode {old_mode:04o} -> {spec.mode:04o}")
        return FileChange(spec.path, False)
    if spec.secret:
        diff = f"{spec.path}: content changed (secret, not shown)"
    else:
        diff = "".join(difflib.unified_diff((old or "").splitlines(True), spec.content.splitlines(True),
                                            fromfile=spec.path if old is not None else "/dev/null",
                                            tofile=spec.path))
    if not check:
        write_atomic(real, spec.content, spec.mode)
    return FileChange(spec.path, True, diff)


def _names(root: Path, db: str) -> set[str]:
    try:
        lines = _under(root, f"/etc/{db}").read_text().splitlines()
    except FileNotFoundError:
        return set()
    return {line.split(":", 1)[0] for line in lines if line and not line.startswith("#")}


def ensure_accounts(root: Path, user: str, check: bool = False) -> list[str]:
    """The service user (system account, own group, no login) and the device groups, if missing."""
    root_args = [] if root == Path("/") else ["--root", str(root)]
    created = []
    for group in DEVICE_GROUPS:
        if group not in _names(root, "group"):
            if not check:
                _run(["groupadd", *root_args, "--system", group])
            created.append(f"group {group}")
    if user not in _names(root, "passwd"):
        if not check:
            _run(["useradd", *root_args, "--system", "--user-group", "--home-dir", f"/var/lib/{STATE_NAME}",
                  "--no-create-home", "--shell", "/usr/sbin/nologin", "--comment", "vLLM server", user])
        created.append(f"user {user}")
    return created


def _run(argv: list[str]) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise UnitError(f"{argv[0]} is not installed (package passwd); create the account yourself") from None
    if done.returncode != 0:
        raise UnitError(f"{' '.join(argv)} failed: {done.stderr.strip()}")


def systemd_running(root: Path) -> bool:
    """systemd is PID 1 here (sd_booted's test); never true for another root."""
    return root == Path("/") and Path("/run/systemd/system").is_dir()


def write(root: Path, specs: list[FileSpec], user: str, check: bool = False) -> WriteReport:
    """Make the host match `specs`; with `check`, only report what would change (Ansible's --check)."""
    report = WriteReport()
    report.accounts = ensure_accounts(root, user, check)
    report.files = [apply_file(root, spec, check) for spec in specs]
    unit_changed = any(f.changed and f.path.endswith(".service") for f in report.files)
    if unit_changed:
        if check:
            report.daemon_reload = "would run"
        elif systemd_running(root):
            _run(["systemctl", "daemon-reload"])
            report.daemon_reload = "done"
        else:
            report.daemon_reload = "skipped: systemd is not running here"
    return report
