"""Terminal output: data to stdout, people-facing chatter to stderr.

Host-supplied strings can contain `[...]`, so rich markup and highlighting are off everywhere.
Imported only by renderers and commands, never by checks or provisioning logic.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def colour_wanted(no_color_flag: bool = False) -> bool:
    return not no_color_flag and "NO_COLOR" not in os.environ


def make_console(stderr: bool = False, no_color: bool = False) -> Any:
    from rich.console import Console

    return Console(
        file=sys.stderr if stderr else sys.stdout,
        markup=False,
        highlight=False,
        emoji=False,
        no_color=not colour_wanted(no_color),
        soft_wrap=True,
    )


def info(message: str) -> None:
    """Progress and hints go to stderr so stdout stays machine-readable."""
    print(message, file=sys.stderr)
