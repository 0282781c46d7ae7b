"""Run the real `rocmdoctor` command line in a subprocess, as a user would (or in this process, where
a test runs it many times: no interpreter start each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
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


def rocmdoctor_in_process(capsys: Any, monkeypatch: Any, *args: str) -> tuple[int, str, str, float]:
    """The real command line in this process: (exit code, stdout, stderr, seconds); never a traceback."""
    import pytest

    from rocmdoctor.cli import main

    monkeypatch.setattr(sys, "argv", ["rocmdoctor", *args])
    started = time.monotonic()
    with pytest.raises(SystemExit) as exited:
        main()
    elapsed = time.monotonic() - started
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in out + err, err
    return exited.value.code, out, err, elapsed
