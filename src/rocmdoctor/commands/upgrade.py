"""`rocmdoctor upgrade`: this host's server onto a new bundle, gated and measured, or back where it was.

The release is chosen with install's options (`--tag`, `--channel`, `--pinned`, `--mirror`, the
pins); `provision/bundle/upgrade.py` runs the steps. Exit 0: moved (or nothing to do); 1: rolled back
(the envelope says why, with the figures) or the upgrade could not run; 2: bad input.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import click

from rocmdoctor import params
from rocmdoctor.commands.bundle_setup import InstallSettings, failures, install_plan, prefix_option
from rocmdoctor.commands.common import App, UserError, emit_change, pass_app
from rocmdoctor.commands.option_groups import (
    DownloadOptions,
    NetworkOptions,
    PinOptions,
    QualifyChoice,
    ReleaseSelection,
    download_options,
    network_options,
    pin_options,
    qualify_options,
    selection_options,
)
from rocmdoctor.commands.smoke_options import _api_key, _url
from rocmdoctor.host_writes import HostWriter

# A systemd unit name (vllm, vllm@0, vllm-cluster-head.service): no path, no option, no spaces.
UNIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9@._:-]{0,254}")
DEFAULT_UNIT = "vllm=http://127.0.0.1:8000"


def _units(values: tuple[str, ...]) -> tuple[object, ...]:
    from rocmdoctor.provision.bundle.upgrade_plan import Unit

    units = []
    for value in values or (DEFAULT_UNIT,):
        name, sep, url = value.partition("=")
        if not sep or not UNIT_NAME.fullmatch(name):
            raise UserError(
                f"--unit {value[:200]!r}: give UNIT=URL, a systemd unit and the address its server "
                f"answers on (e.g. {DEFAULT_UNIT}, vllm@1=http://127.0.0.1:8001)"
            )
        units.append(Unit(name, _url(url)))
    names = [u.name for u in units]
    if len(set(names)) != len(names):
        raise UserError(f"--unit: each unit once ({', '.join(names)})")
    return tuple(units)


def _balancer_url(value: str) -> str:
    """The hook's URL as given (its path and query name the backend to the balancer), if it is one."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a port out of range
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(
            f"--load-balancer {value[:200]!r}: give the http(s) URL of this host's hook on the load "
            "balancer (e.g. http://lb.example:9000/backends/host1)"
        )
    return value


def _figures_line(unit: str, figures: dict[str, Any]) -> str:
    measured, latency = figures["measured"], figures["p95_change_pct"]
    p95 = "no p95" if latency is None else f"p95 {measured['p95_ms']:g} ms ({latency:+g} %)"
    return f"{unit}: {measured['tokens_per_s']:g} tok/s ({figures['throughput_change_pct']:+g} %), {p95}"


@click.command()
@click.option("--family", default="auto", show_default=True, help="GPU family, or auto: from this host.")
@click.option("--version", "version", default=None, help="vLLM version the release must have.")
@selection_options
@prefix_option
@click.option(
    "--mirror",
    envvar="ROCMDOCTOR_MIRROR",
    default=None,
    help="Directory or base URL with the release's files (see `bundle fetch`). [env: ROCMDOCTOR_MIRROR]",
)
@pin_options
@download_options
@network_options
@qualify_options
@click.option(
    "--unit",
    "unit_values",
    multiple=True,
    metavar="UNIT=URL",
    help=f"A unit to restart and the server it runs (repeat for vllm@ instances; default {DEFAULT_UNIT}).",
)
@click.option("--model", default="auto", show_default=True, help="Served model name for smoke and bench.")
@click.option(
    "--api-key-file",
    type=params.NonEmptyPath(path_type=Path, dir_okay=False),
    callback=params.key_file(),
    default=None,
    help="File holding the servers' API key (vLLM --api-key).",
)
@click.option(
    "--all-at-once", is_flag=True, help="Restart every unit together (default: one unit at a time)."
)
@click.option(
    "--max-regression",
    "max_regression",
    type=params.Duration(max_s=1000, inclusive=True),
    default=10.0,
    show_default=True,
    help="Roll back when throughput falls or p95 latency rises by more than this percentage.",
)
@click.option(
    "--drain-timeout",
    type=params.Duration(max_s=24 * 3600, inclusive=True),
    default=60.0,
    show_default=True,
    help="Seconds to wait for the requests in flight to end before a restart.",
)
@click.option(
    "--ready-timeout",
    type=params.Duration(max_s=24 * 3600),
    default=600.0,
    show_default=True,
    help="Seconds a restarted server has to answer /health.",
)
@click.option(
    "--baseline-dir",
    type=params.NonEmptyPath(path_type=Path, file_okay=False),
    default=None,
    help="Where each unit's baseline lives (bench-baseline.<unit>.json, `bench --json` of the old "
    "bundle); default the prefix. A unit without one is measured before the upgrade and recorded.",
)
@click.option(
    "--load-balancer",
    "load_balancer",
    default=None,
    metavar="URL",
    help='This host\'s load-balancer hook: POST {"unit": UNIT, "state": "draining"} before a unit is '
    'drained, "serving" once it serves again; any 2xx is taken (docs/fleet.md).',
)
@click.option(
    "--ready-only",
    is_flag=True,
    help="Gate the units on readiness only: a multi-node group's worker, whose server the head's "
    "upgrade smokes and measures (playbooks/upgrade.yml, docs/fleet.md).",
)
@click.option("--check", is_flag=True, help="Dry run: show the plan, change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the change envelope on stdout.")
@pass_app
def upgrade(
    app: App,
    family: str,
    version: str | None,
    prefix: Path,
    mirror: str | None,
    unit_values: tuple[str, ...],
    model: str,
    api_key_file: Path | None,
    all_at_once: bool,
    max_regression: float,
    drain_timeout: float,
    ready_timeout: float,
    baseline_dir: Path | None,
    load_balancer: str | None,
    ready_only: bool,
    check: bool,
    as_json: bool,
    selection: ReleaseSelection,
    pins: PinOptions,
    download: DownloadOptions,
    network: NetworkOptions,
    qualification: QualifyChoice,
) -> None:
    """Upgrade this host's server to a new bundle: stage it beside `current`, drain, switch, restart,
    then gate on readiness, smoke and the bench baseline; a failed gate or a regression beyond
    --max-regression rolls back to the bundle it came from. A rerun resumes an interrupted upgrade."""
    from rocmdoctor.provision.bundle.upgrade import UpgradeOptions
    from rocmdoctor.provision.bundle.upgrade import upgrade as run_upgrade

    units = _units(unit_values)
    balancer = _balancer_url(load_balancer) if load_balancer is not None else None
    with failures(as_json):
        plan, _, _ = install_plan(
            app,
            family,
            prefix,
            mirror,
            version,
            InstallSettings(),
            selection,
            pins,
            download,
            network,
            qualification,
        )
        options = UpgradeOptions(
            units,  # type: ignore[arg-type]
            baseline_dir or prefix,
            model,
            _api_key(api_key_file),
            all_at_once,
            max_regression,
            drain_timeout,
            ready_timeout,
            load_balancer=balancer,
            ready_only=ready_only,
        )
        result = run_upgrade(plan, options, HostWriter(Path("/"), check_mode=check))
    _report(result, as_json)


def _report(result: Any, as_json: bool) -> None:
    """The change envelope with a line per step and per unit's figures; exit 1 when a gate failed."""
    details = [f"{s['step']}{' ' + s['unit'] if s['unit'] else ''}: {s['detail']}" for s in result.steps]
    details += [_figures_line(unit, figures) for unit, figures in result.figures.items()]
    emit_change(result.change(), as_json, details)
    if result.failed:
        sys.exit(1)
