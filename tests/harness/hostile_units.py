"""Every unit rocmdoctor writes, rendered with one foreign value in one field (tests of unit_syntax).

FIELDS maps a field name to a function value -> {unit file name: content}; each renders the units that
field reaches: the single server (vllm.service), the instances' template (vllm@.service), the cluster's
head, worker and Ray units, and the health service.
"""

from __future__ import annotations

from collections.abc import Callable

from rocmdoctor.cluster.layout import ClusterLayout
from rocmdoctor.provision.server import cluster_unit
from rocmdoctor.provision.server.args import ServerArgs, Setting
from rocmdoctor.provision.server.health_unit import health_units
from rocmdoctor.provision.server.instances import render_template
from rocmdoctor.provision.server.unit import ServiceLayout, command_line, render_unit

PREFIX = "/opt/rocmdoctor"
MODEL = "/srv/models/tiny"
# Every printable character systemd gives a meaning to: whitespace, both quotes, a specifier and its
# escape, a variable reference and its escape, a backslash, a command separator.
PRINTABLE = "a b\"c'd %n %% $X ${Y} $$ \\e ;"
# A value ending in a backslash: on a plain setting it would join the next line.
TRAILING_BACKSLASH = "tail\\"
CONTROL = ("x\nExecStartPre=+/bin/sh -c id", "x\rEnvironment=LD_PRELOAD=/tmp/x.so", "x\0y", "x\ty")
# What the hostile values of the issue did: an extra line, extra environment variables.
INJECTIONS = ("eth0\nExecStartPre=+/bin/sh -c id", "eth0 LD_PRELOAD=/tmp/x.so", 'eth0" "PYTHONPATH=/tmp')


def server_args(model_name: str = "tiny", extra: str = "--seed=1", env: str = "1") -> ServerArgs:
    settings = [
        Setting("--model", MODEL, ""),
        Setting("--served-model-name", model_name, ""),
        Setting("--host", "127.0.0.1", ""),
        Setting("--port", "8000", ""),
    ]
    return ServerArgs(settings, [extra], environment={"ROCMDOCTOR_HOSTILE": env})


def single(args: ServerArgs) -> dict[str, str]:
    return {"vllm.service": render_unit(args, ServiceLayout(prefix=PREFIX), "vllm")}


def template(model_name: str = "tiny", extra: str = "--seed=1") -> dict[str, str]:
    common = ["--model", MODEL, "--served-model-name", model_name, extra]
    return {
        "vllm@.service": render_template(
            common, model_name, "127.0.0.1", ServiceLayout(prefix=PREFIX), "vllm"
        )
    }


def cluster(args: ServerArgs, advertise: str = "10.0.0.2", ifname: str | None = "eth0") -> dict[str, str]:
    out = {}
    layout = ServiceLayout(prefix=PREFIX)
    for backend in ("mp", "ray"):
        for rank in (0, 1):
            nodes = ClusterLayout(2, "10.0.0.1", backend=backend)
            for spec in cluster_unit.specs(args, nodes, rank, advertise, ifname, layout, "vllm", None):
                if spec.path.endswith(".service") and "rocmdoctor-health" not in spec.path:
                    out[f"{backend}{rank}-{spec.path.rsplit('/', 1)[1]}"] = spec.content
    return out


def health(textfile_dir: str) -> dict[str, str]:
    units = health_units(PREFIX, "/etc/systemd/system", command_line, f"{textfile_dir}/rocmdoctor.prom")
    return {path.rsplit("/", 1)[1]: text for path, text in units}


FIELDS: dict[str, Callable[[str], dict[str, str]]] = {
    "served model name": lambda v: {**single(server_args(model_name=v)), **template(model_name=v)},
    "vLLM argument": lambda v: {
        **single(server_args(extra=v)),
        **template(extra=v),
        **cluster(server_args(extra=v)),
    },
    "environment value": lambda v: {**single(server_args(env=v)), **cluster(server_args(env=v))},
    "advertised address": lambda v: cluster(server_args(), advertise=v),
    "socket interface": lambda v: cluster(server_args(), ifname=v),
    "textfile directory": lambda v: health(f"/var/lib/{v}"),
}
