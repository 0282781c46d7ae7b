"""Numbers in foreign text (a /proc name, a field of /etc/passwd, a login.defs value, a port).

`str.isdigit()` is true for '²' and other characters that `int()` refuses, and `int()` of a
5,000-digit string raises (or costs quadratic time): every such field is read here, ASCII digits only,
a bounded count of them, or None.
"""

from __future__ import annotations

MAX_DIGITS = 19  # every id, pid, port and count rocmdoctor reads fits in 64 bits


def is_decimal(text: str, max_digits: int = MAX_DIGITS) -> bool:
    return 0 < len(text) <= max_digits and text.isascii() and text.isdecimal()


def parse_decimal(text: str, max_digits: int = MAX_DIGITS) -> int | None:
    """The non-negative integer `text` spells in ASCII digits, or None."""
    return int(text) if is_decimal(text, max_digits) else None
