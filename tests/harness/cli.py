"""The `rocmdoctor` command line run in this process, as a user's shell would run it: the real `main()`
(its exit codes and its last-resort "internal error"), argv, environment and standard streams of its
own, and the result shaped like `subprocess.CompletedProcess` so a test reads it the same way.

About ten times cheaper than a new interpreter, which is what most CLI tests paid for. Tests whose
point is the process boundary (signals, a kill at a random point, the exit status of a real process,
what another program sees) keep spawning `python -m rocmdoctor`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from click.testing import CliRunner

# Set by the test environment, never by a user's command line: a test's own choice wins.
CLEARED = ("ROCMDOCTOR_ROOT",)


def rocmdoctor(
    *args: str,
    root: Path | str | None = None,
    env: Mapping[str, str | None] | None = None,
    input: str | bytes | None = None,
) -> subprocess.CompletedProcess[str]:
    """`rocmdoctor [--root R] ARGS` in this process. `env` adds to (or, with None, removes from) the
    environment for the run; everything is restored afterwards."""
    from rocmdoctor import sensitive
    from rocmdoctor.cli import main

    # A new process knows no secret yet: one read by an earlier run must not be redacted from this one.
    sensitive._SECRETS.clear()

    argv = ["rocmdoctor", *(["--root", str(root)] if root is not None else []), *args]
    overrides: dict[str, str | None] = {name: None for name in CLEARED}
    overrides.update(env or {})
    saved_argv, saved_cwd = sys.argv, os.getcwd()
    code: int | str | None = 0
    with CliRunner().isolation(input=input or b"", env=overrides) as (out, err, _mixed):
        sys.argv = argv
        try:
            main()
        except SystemExit as exited:
            code = exited.code
        finally:
            sys.argv = saved_argv
            os.chdir(saved_cwd)
            sys.stdout.flush()
            sys.stderr.flush()
        stdout, stderr = out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")
    if isinstance(code, str):  # sys.exit("message"): printed to stderr, status 1, as the interpreter does
        stderr, code = stderr + code + "\n", 1
    return subprocess.CompletedProcess(argv, int(code or 0), stdout, stderr)
