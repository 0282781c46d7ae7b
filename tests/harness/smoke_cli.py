"""Run the real `rocmdoctor` command line as a user would, in this process (harness.cli): no
interpreter start each, which smoke and bench tests pay many times."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from harness.cli import rocmdoctor as run_in_process


def rocmdoctor(*args: str, env: dict[str, str] | None = None) -> Any:
    result = run_in_process(*args, env=env)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def rocmdoctor_json(*args: str) -> tuple[int, dict[str, Any]]:
    result = rocmdoctor(*args, "--json")
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
