"""Small helpers the command modules share."""

from __future__ import annotations

import sys
from typing import Any

import click

from ..cli import App, UserError
from ..report import dumps

__all__ = ["App", "UserError", "emit_json", "pass_app"]

pass_app = click.make_pass_decorator(App)


def emit_json(document: Any) -> None:
    sys.stdout.write(dumps(document))
    sys.stdout.flush()
