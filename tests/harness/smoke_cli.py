"""Run the real `rocmdoctor` command line in a subprocess, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

CLI_TIMEOUT_S = 180


def rocmdoctor(
    *args: str, timeout: float = CLI_TIMEOUT_S, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "rocmdoctor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )
    assert "Traceback" not in result.stderr, result.stderr
    return result


def rocmdoctor_json(*args: str, timeout: float = CLI_TIMEOUT_S) -> tuple[int, dict[str, Any]]:
    result = rocmdoctor(*args, "--json", timeout=timeout)
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


def steps_by_id(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {step["id"]: step for step in report["steps"]}
