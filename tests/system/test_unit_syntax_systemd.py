"""The real systemd reads back exactly the foreign values rocmdoctor wrote into its units.

Every unit rocmdoctor writes (the single server, the instances' template, the cluster's worker and Ray
units, the health service) is rendered with a value holding every printable character systemd gives a
meaning to (whitespace, quotes, `%` specifiers, `$` references, backslashes, `;`) in each foreign field
it has, installed in a booted Debian (systemd-nspawn) and started. The programs the units name are one
recorder that prints its argv and environment to the journal, so what is compared is what systemd
actually ran: the same words and the same variables as rocmdoctor meant, no more.
(Control characters are refused before anything is written: tests/unit/test_unit_syntax.py.)"""

from __future__ import annotations

import json

import pytest

from harness.hostile_units import MODEL, PREFIX, PRINTABLE, cluster, health, server_args, single, template
from harness.nspawn import Bind, boot
from harness.polling import wait_for
from rocmdoctor.cluster.layout import ClusterLayout
from rocmdoctor.provision.server import cluster_unit
from rocmdoctor.provision.server.instances import PORT_VAR, TP_VAR, UTIL_VAR, env_path
from rocmdoctor.provision.server.unit import ServiceLayout

pytestmark = [pytest.mark.nspawn, pytest.mark.timeout(600)]

RECORDER = (
    "#!/usr/bin/python3 -I\n"
    "import json, os, sys\n"
    "keep = ('ROCMDOCTOR_HOSTILE', 'VLLM_HOST_IP', 'GLOO_SOCKET_IFNAME')\n"
    "print('RECORDED ' + json.dumps({'argv': sys.argv, 'env': {k: os.environ[k] for k in keep if k in os.environ}}), flush=True)\n"
)
PROGRAMS = ("current/bin/vllm-server", "current/bin/python3", "venv/bin/rocmdoctor")
TEXTFILE_DIR = "/var/lib/h%n$X"


def units() -> dict[str, str]:
    """unit name on the machine -> content."""
    args = server_args(model_name=PRINTABLE, extra=PRINTABLE, env=PRINTABLE)
    out = {"h-single.service": single(args)["vllm.service"]}
    out["h-tmpl@.service"] = template(model_name=PRINTABLE, extra=PRINTABLE)["vllm@.service"]
    for name, text in cluster(server_args(extra=PRINTABLE, env=PRINTABLE), advertise=PRINTABLE).items():
        if name.startswith(("mp1-", "ray1-")):  # the worker and the Ray worker (rank 0 is the single unit)
            out[f"h-{name}"] = text
    out["h-health.service"] = health(TEXTFILE_DIR)["rocmdoctor-health.service"]
    return out


def expected() -> dict[str, list[dict]]:
    """What each unit must run: the argv (after the program) and the variables, from rocmdoctor's own
    description of them (cluster_unit.process: what the unit runs, for hosts without systemd)."""
    layout = ServiceLayout(prefix=PREFIX)
    args = server_args(model_name=PRINTABLE, extra=PRINTABLE, env=PRINTABLE)
    env = {"ROCMDOCTOR_HOSTILE": PRINTABLE}
    out = {
        "h-single.service": [
            {"argv": [layout.server, *args.argv()], "env": env},
            {
                "argv": [layout.python, layout.wait_ready, "http://127.0.0.1:8000", PRINTABLE, "1800"],
                "env": env,
            },
        ],
        "h-tmpl@0.service": [
            {
                "argv": [
                    layout.server,
                    *["--model", MODEL, "--served-model-name", PRINTABLE, PRINTABLE],
                    *["--port", "8123", "--gpu-memory-utilization", "0.5", "--tensor-parallel-size", "1"],
                ],
                "env": {},
            },
            {
                "argv": [layout.python, layout.wait_ready, "http://127.0.0.1:8123", PRINTABLE, "1800"],
                "env": {},
            },
        ],
        "h-health.service": [
            {
                "argv": [
                    f"{PREFIX}/venv/bin/rocmdoctor",
                    "check",
                    "--prefix",
                    PREFIX,
                    "--textfile",
                    f"{TEXTFILE_DIR}/rocmdoctor.prom",
                ],
                "env": {},
            }
        ],
    }
    worker_args = server_args(extra=PRINTABLE, env=PRINTABLE)
    for backend, name in (("mp", "h-mp1-vllm-worker.service"), ("ray", "h-ray1-ray-worker.service")):
        runs = cluster_unit.process(
            worker_args, ClusterLayout(2, "10.0.0.1", backend=backend), 1, PRINTABLE, "eth0", layout
        )
        keep = {
            k: v
            for k, v in runs["environment"].items()
            if k in ("ROCMDOCTOR_HOSTILE", "VLLM_HOST_IP", "GLOO_SOCKET_IFNAME")
        }
        out[name] = [{"argv": runs["exec_start"], "env": keep}]
    return out


@pytest.fixture
def machine(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    for name, text in units().items():
        (files / name).write_text(text)
    (files / "recorder").write_text(RECORDER)
    started = boot(
        "unit-syntax", netns="unit-syntax", binds=[Bind(str(files), "/srv/files")], log_dir=tmp_path
    )
    yield started
    started.stop()


def recorded(machine, unit: str) -> list[dict]:
    text = machine.run(["journalctl", "-u", unit, "-o", "cat", "--no-pager"]).stdout
    return [json.loads(ln[len("RECORDED ") :]) for ln in text.splitlines() if ln.startswith("RECORDED ")]


def test_systemd_runs_exactly_the_words_and_variables_written(machine):
    setup = [
        "getent group render || groupadd --system render",
        "useradd --system --user-group --no-create-home vllm",
        "cp /srv/files/*.service /etc/systemd/system/",
        *[f"install -D -m 0755 /srv/files/recorder {PREFIX}/{program}" for program in PROGRAMS],
        f"mkdir -p '{TEXTFILE_DIR}' /var/lib/prometheus/node-exporter $(dirname {env_path('0')})",
        f"printf '{PORT_VAR}=8123\\n{UTIL_VAR}=0.5\\n{TP_VAR}=1\\n' > {env_path('0')}",
        "systemctl daemon-reload",
    ]
    for step in setup:
        machine.run(step)
    want = expected()
    for unit in want:
        machine.run(["systemctl", "start", unit], timeout=120)
    for unit, runs in want.items():
        got = wait_for(
            lambda u=unit, n=len(runs): len(r := recorded(machine, u)) >= n and r, 60, f"{unit}'s programs"
        )
        # ExecStartPre (stop-leftovers %n) is recorded too; the runs named must be among what ran.
        for run in runs:
            assert run in got, (unit, run, got)
    assert (
        machine.unit_property("h-single.service", "Description")
        == f"vLLM OpenAI-compatible server ({PRINTABLE})"
    )
