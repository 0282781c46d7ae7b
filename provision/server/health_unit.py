"""rocmdoctor-health.service and .timer: `rocmdoctor check --textfile` every few minutes.

Pure: the prefix and the unit directory in, the two files out. Written beside the server's units by
`unit --write` and `instances --write` (and so by the role); node_exporter reads the file from its
textfile directory (Debian's prometheus-node-exporter: /var/lib/prometheus/node-exporter).
"""

from __future__ import annotations

from collections.abc import Callable

from rocmdoctor.host_files import shipped_text
from rocmdoctor.provision.server import unit_syntax

SERVICE_NAME = "rocmdoctor-health.service"
TIMER_NAME = "rocmdoctor-health.timer"
# Debian's default --collector.textfile.directory (prometheus-node-exporter 1.5.0, --help).
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
TEXTFILE = f"{TEXTFILE_DIR}/rocmdoctor.prom"
INTERVAL = "2min"


def rocmdoctor_path(prefix: str) -> str:
    """Where the role installs rocmdoctor on a host (rocmdoctor_venv = <prefix>/venv)."""
    return f"{prefix}/venv/bin/rocmdoctor"


def health_units(
    prefix: str,
    unit_dir: str,
    command_line: Callable[[list[str]], str],
    textfile: str = TEXTFILE,
    user: str = "vllm",
) -> list[tuple[str, str]]:
    """(path, content) of the service and the timer; `command_line` quotes ExecStart= (unit.py's)."""
    fields = {
        "exec_start": unit_syntax.Field(
            command_line([rocmdoctor_path(prefix), "check", "--prefix", prefix, "--textfile", textfile])
        ),
        "textfile_dir": unit_syntax.path(textfile.rsplit("/", 1)[0], "the textfile directory"),
        "interval": unit_syntax.Field(INTERVAL),
        "user": unit_syntax.name(user, "--user"),
    }
    out = []
    for name in (SERVICE_NAME, TIMER_NAME):
        template = shipped_text("rocmdoctor.provision.server", f"templates/{name}")
        out.append((f"{unit_dir}/{name}", unit_syntax.render(template, fields, f"templates/{name}")))
    return out
