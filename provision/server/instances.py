"""Several vLLM servers under systemd: the template unit `vllm@.service`, one environment file per
instance and `vllm.target`, which groups them.

    systemctl start vllm.target      # every instance of the layout
    systemctl restart vllm@3         # one of them

The template is the single server's unit (provision/server/templates/vllm.service, rendered with
unit.py's helpers): the same hardening, readiness gate (ExecStartPost waits for a real completion)
and KillMode=control-group. What differs per instance (devices, port, memory share, tensor-parallel
size) lives in /etc/rocmdoctor/vllm/<instance>.env, which the unit's command line reads through
${...} references. rocmdoctor owns that directory, so an instance the new layout no longer has is
removed by deleting its file there; nothing else is touched.

All instances run as the one service user. The template's RemoveIPC=yes is safe with that: systemd
counts the running units per user and removes the user's shared memory only when the last one
stops (src/core/manager.c, manager_unref_uid_internal), so stopping vllm@0 leaves vllm@1's
/dev/shm message queues alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rocmdoctor.host_files import shipped_text
from rocmdoctor.host_writes import HostWriter, WriteRefused
from rocmdoctor.params import service_user_problem
from rocmdoctor.provision.server import unit_syntax
from rocmdoctor.provision.server.args import ServerArgs, Setting
from rocmdoctor.provision.server.jit_cache import ENV_FILE as JIT_ENV_FILE
from rocmdoctor.provision.server.layout import Instance, Plan
from rocmdoctor.provision.server.unit import (
    DEFAULT_LOAD_TIMEOUT_S,
    STATE_NAME,
    SYSTEMD_UNITS,
    UNIT_DIR,
    FileSpec,
    ServiceLayout,
    UnitError,
    WriteReport,
    apply_file,
    daemon_reload,
    ensure_accounts,
    health_specs,
    helper_specs,
    ip_fence,
    readiness_url,
    stop_leftovers_argv,
)
from rocmdoctor.textnum import is_decimal
from rocmdoctor.vllm.environment import BUNDLE_SETTINGS

TEMPLATE_NAME = "vllm@.service"
TARGET_NAME = "vllm.target"
ENV_DIR = "/etc/rocmdoctor/vllm"
PORT_VAR = "ROCMDOCTOR_PORT"
UTIL_VAR = "ROCMDOCTOR_GPU_MEMORY_UTILIZATION"
TP_VAR = "ROCMDOCTOR_TENSOR_PARALLEL_SIZE"
# ROCr filters and renumbers; HIP numbers what is left from 0 (see layout.py), so only this is set.
DEVICES_VAR = "ROCR_VISIBLE_DEVICES"
INSTANCE_NAME = re.compile(r"[0-9]{1,4}")
ENV_LIMIT = 64 << 10


def server_url(host: str, port: int) -> str:
    """Where a server on host:port is reached from this machine (the unit's readiness URL)."""
    return readiness_url(ServerArgs([Setting("--host", host, ""), Setting("--port", str(port), "")], []))


def env_path(name: str) -> str:
    return f"{ENV_DIR}/{name}.env"


def _ref(var: str) -> str:
    # ${VAR} is replaced by the variable's value as exactly one argument (systemd.service, "Command
    # lines"); it is written raw, after the quoted words, so it is never escaped to $${VAR}.
    return "${" + var + "}"


def render_template(
    common_argv: list[str],
    served_model_name: str,
    host: str,
    layout: ServiceLayout,
    user: str,
    timeout_s: int = DEFAULT_LOAD_TIMEOUT_S,
) -> str:
    """vllm@.service: the single server's unit with the per-instance values read from %i's env file."""
    problem = service_user_problem(user)
    if problem:
        raise UnitError(f"--user {user!r}: {problem}")
    base = server_url(host, 0).rsplit(":", 1)[0]
    port = unit_syntax.Verbatim(_ref(PORT_VAR))
    exec_start = unit_syntax.command(
        [
            layout.server,
            *common_argv,
            "--port",
            port,
            "--gpu-memory-utilization",
            unit_syntax.Verbatim(_ref(UTIL_VAR)),
            "--tensor-parallel-size",
            unit_syntax.Verbatim(_ref(TP_VAR)),
        ]
    )
    # The readiness URL: the quoted base and ${PORT} as one word ("http://127.0.0.1:"${PORT}: systemd
    # joins a quoted part and the reference that follows it, and replaces ${PORT} as part of the word).
    url = unit_syntax.exec_word(f"{base}:") + port.text
    exec_post = unit_syntax.Field(
        " ".join(
            [
                unit_syntax.command_line([layout.python, layout.wait_ready]),
                url,
                unit_syntax.command_line([served_model_name, str(timeout_s)]),
            ]
        )
    )
    fields = {
        "unit_name": unit_syntax.name(TEMPLATE_NAME, "unit name"),
        "description": unit_syntax.Field(
            unit_syntax.text(served_model_name, "the model name").text + ", instance %i"
        ),
        "user": unit_syntax.name(user, "--user"),
        "state_name": unit_syntax.name(STATE_NAME, "state directory"),
        "bundle_environment": unit_syntax.environment(BUNDLE_SETTINGS),
        "env_file": unit_syntax.path(env_path("%i"), "the instance's environment file", specifiers=True),
        "jit_env_file": unit_syntax.path(
            f"{layout.prefix}/current/{JIT_ENV_FILE}", "--prefix"
        ),  # one StateDirectory: shared caches
        "exec_start_pre": unit_syntax.Field(stop_leftovers_argv(layout)),
        "exec_start": exec_start,
        "exec_start_post": exec_post,
        "timeout_start_s": unit_syntax.number(timeout_s + 60),
        **ip_fence(host, common_argv),
    }
    template = shipped_text("rocmdoctor.provision.server", "templates/vllm.service")
    text = unit_syntax.render(template, fields, "templates/vllm.service")
    text = text.replace("`rocmdoctor unit --write`", "`rocmdoctor instances --write`")
    return unit_syntax.instance_of(
        text,
        unit_syntax.name(TARGET_NAME, "the instances' target"),
        fields["env_file"],
        "templates/vllm.service",
    )


def render_target(plan: Plan) -> str:
    """vllm.target: wants every instance and is ordered after them, so `systemctl start vllm.target`
    returns once every instance passed its readiness gate (or failed)."""
    wants = [unit_syntax.name(f"vllm@{i.name}.service", "an instance's unit").text for i in plan.instances]
    fields = {
        "layout": unit_syntax.text(plan.layout, "the layout"),
        "count": unit_syntax.number(len(plan.instances)),
        "wants": unit_syntax.Field(" ".join(wants)),
    }
    template = shipped_text("rocmdoctor.provision.server", "templates/vllm.target")
    return unit_syntax.render(template, fields, "templates/vllm.target")


def render_env(instance: Instance, api_key: str | None) -> str:
    lines = [
        f"# Written by `rocmdoctor instances --write`: vllm@{instance.name} (mode 0600: it may hold the key).",
        *(f"# {d.label}" for d in instance.devices),
        f"{DEVICES_VAR}={instance.visible_devices}",
        f"{PORT_VAR}={instance.port}",
        f"{UTIL_VAR}={instance.gpu_memory_utilization:.2f}",
        f"{TP_VAR}={instance.tensor_parallel_size}",
    ]
    if api_key:
        lines.append(f"VLLM_API_KEY={api_key}")
    return "\n".join(lines) + "\n"


def file_specs(
    plan: Plan,
    common_argv: list[str],
    served_model_name: str,
    host: str,
    layout: ServiceLayout,
    user: str,
    api_key: str | None,
    timeout_s: int = DEFAULT_LOAD_TIMEOUT_S,
) -> list[FileSpec]:
    return [
        FileSpec(
            f"{layout.unit_dir}/{TEMPLATE_NAME}",
            render_template(common_argv, served_model_name, host, layout, user, timeout_s),
            0o644,
        ),
        FileSpec(f"{layout.unit_dir}/{TARGET_NAME}", render_target(plan), 0o644),
        *(FileSpec(env_path(i.name), render_env(i, api_key), 0o600, secret=True) for i in plan.instances),
        *helper_specs(layout),
        *health_specs(layout, user),
    ]


def parse_env(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith("#"):
            out[key.strip()] = value.strip()
    return out


def current_instances(writer: HostWriter) -> dict[str, dict[str, str]]:
    """The instances written now: name -> its env file's variables."""
    out = {}
    for entry in writer.listdir(ENV_DIR):
        name = entry.removesuffix(".env")
        if entry.endswith(".env") and INSTANCE_NAME.fullmatch(name):
            raw = writer.read_current(env_path(name), ENV_LIMIT)
            out[name] = parse_env(raw.decode("utf-8", "replace")) if raw is not None else {}
    return out


# The template's readiness gate: ExecStartPost=... <base URL>:${ROCMDOCTOR_PORT} <model> <timeout>
READINESS_BASE = re.compile(
    r"^ExecStartPost=.*\s(https?://\S+):\$\{" + PORT_VAR + r"\}(?:\s|$)", re.MULTILINE
)


def written_base_url(writer: HostWriter, unit_dir: str = UNIT_DIR) -> str | None:
    """Where the written instances are reached from this machine (`http://host`, before the port):
    the address the template's own readiness gate uses; None without a readable template."""
    raw = writer.read_current(f"{unit_dir}/{TEMPLATE_NAME}", ENV_LIMIT)
    match = READINESS_BASE.search(raw.decode("utf-8", "replace")) if raw is not None else None
    return match.group(1) if match else None


def instance_ports(writer: HostWriter) -> dict[str, int]:
    """The port each written instance's env file names (instance name -> port)."""
    ports = {}
    for name, env in current_instances(writer).items():
        value = env.get(PORT_VAR, "")
        if is_decimal(value) and 0 < int(value) < 65536:
            ports[name] = int(value)
    return ports


def owned_ports(writer: HostWriter) -> set[int]:
    """Ports the written instances' env files claim (whether their servers hold them is the caller's to
    ask: commands/instances.ports_still_ours)."""
    return set(instance_ports(writer).values())


@dataclass
class FileAction:
    """One file of an instances write and what was done to it (unit.FileChange, with the action)."""

    path: str
    action: str  # "unchanged", "created", "updated", "mode", "removed"
    diff: str = ""

    @property
    def changed(self) -> bool:
        return self.action != "unchanged"

    def to_json(self) -> dict:
        return {"path": self.path, "changed": self.changed, "action": self.action, "diff": self.diff}


@dataclass
class Report(WriteReport[FileAction]):
    restart: list[str] = field(default_factory=list)  # running instances whose settings changed

    def to_json(self) -> dict:
        return {**super().to_json(), "restart_needed": self.restart}


def _apply(writer: HostWriter, spec: FileSpec) -> FileAction:
    existed = writer.read_current(spec.path) is not None
    change = apply_file(writer, spec)
    if not change.changed:
        return FileAction(spec.path, "unchanged")
    if spec.secret:
        return FileAction(
            spec.path,
            "created" if not existed else "updated",
            f"{spec.path}: content changed (it may hold the API key: not shown)",
        )
    action = "mode" if change.diff.startswith("mode ") else ("created" if not existed else "updated")
    return FileAction(spec.path, action, change.diff)


def write(writer: HostWriter, specs: list[FileSpec], user: str) -> Report:
    """Make the writer's tree match: files replaced atomically only when they differ, instance files
    the layout no longer has removed, accounts created, systemd reloaded when a unit changed (a writer
    in check mode only reports)."""
    report = Report(check=writer.check_mode)
    try:
        report.accounts = ensure_accounts(writer, user)
        before = current_instances(writer)
        report.files = [_apply(writer, spec) for spec in specs]
        wanted = {spec.path for spec in specs}
        for name in sorted(before, key=int):
            path = env_path(name)
            if path not in wanted:
                writer.remove_file(path)
                report.files.append(
                    FileAction(
                        path,
                        "removed",
                        f"{path}: instance {name} is not in the new layout (stop it: systemctl stop vllm@{name})",
                    )
                )
    except WriteRefused as exc:
        raise UnitError(str(exc)) from None
    report.restart = [
        name
        for name in sorted(before, key=int)
        if any(c.path == env_path(name) and c.action == "updated" for c in report.files)
    ]
    if any(c.changed and c.path.endswith(SYSTEMD_UNITS) for c in report.files):
        try:
            report.daemon_reload = daemon_reload(writer)
        except WriteRefused as exc:
            raise UnitError(str(exc)) from None
    return report
