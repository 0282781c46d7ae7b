"""Host fixture trees (tests/fixtures/hosts/<id>/) and running `rocmdoctor check` on them."""

from __future__ import annotations

import fnmatch
import json
import subprocess
from pathlib import Path
from typing import Any

HOSTS = Path(__file__).resolve().parent.parent / "fixtures" / "hosts"
# The ids are a contract: other helpers' tests use them.
FIXTURE_IDS = (
    "strix-halo-nocwsr-dkms",
    "strix-halo-clean",
    "strix-halo-default-ttm",
    "strix-halo-carveout",
    "strix-point",
    "rx7900xtx-no-render",
    "r9700",
    "mi300x",
    "no-amd-gpu",
    "mi308x-cpx",
    "mi300x-cpx",
    "rx7900xtx-beside-igpu",
    "r9700-beside-nvidia",
    "wsl",
    "mi350x",
    "r9700-beside-780m",
    "r9700-beside-780m-igpu-first",
    "strix-halo-beside-r9700",
    "strix-halo-unbound",
    "r9700-docker-unmapped-gid",
    "r9700-x4-ipc-legacy",
    "r9700-rocm10-kernel7",
)
ROOT_PLACEHOLDER = "<root>"
VERSION_PLACEHOLDER = "<version>"


def fixture_root(fixture_id: str) -> Path:
    return HOSTS / fixture_id


def run_check(root: Path | str, check_id: str, **options: Any) -> Any:
    """The Result of one check on the tree at `root` (Options(**options)), in this process."""
    from rocmdoctor.checks import load_registry
    from rocmdoctor.host import Host
    from rocmdoctor.registry import Context, Options

    registry = load_registry()
    outcomes = registry.run(Context(Host(Path(root)), Options(**options)), registry.select(only=[check_id]))
    return {o.spec.id: o.result for o in outcomes}[check_id]


def two_instance_layout() -> list[str]:
    """`instances` arguments for two servers of one partition each, from the MI308X CPX node's topology."""
    return [
        "--devices-from",
        str(fixture_root("mi308x-cpx")),
        "--instances",
        "per-partition",
        "--count",
        "2",
    ]


def covered(path: str, pattern: str) -> bool:
    """`path` is `pattern` or one of the directories leading to it (one segment per wildcard)."""
    parts, pat = [p for p in path.split("/") if p], [p for p in pattern.split("/") if p]
    return len(parts) <= len(pat) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(parts, pat, strict=False))


def run_cli(
    *args: str, root: Path | str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`rocmdoctor [--root R] ARGS`, in this process (harness.cli)."""
    from harness.cli import rocmdoctor

    return rocmdoctor(*args, root=root, env=env)


def check_json(root: Path | str, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = run_cli("check", "--json", *args, root=root)
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def normalize(report: dict[str, Any]) -> dict[str, Any]:
    """What may differ between machines and releases, replaced by placeholders."""
    out = json.loads(json.dumps(report))
    root = out["root"]
    out["root"] = ROOT_PLACEHOLDER
    out["version"] = VERSION_PLACEHOLDER
    text = json.dumps(out).replace(json.dumps(root)[1:-1], ROOT_PLACEHOLDER)
    return json.loads(text)
