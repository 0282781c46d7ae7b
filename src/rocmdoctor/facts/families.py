"""Which vllm-rocm bundle family runs on which GPU: read from the shipped manifest, the one place it is written.

`checks` (the diagnosis names the family) and `provision` (install resolves `--family auto`) both ask
here, so adding a GPU family is one `[families.X]` table with its `targets` in bundles/manifest.toml.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from importlib import resources

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


@lru_cache(maxsize=1)
def _targets() -> dict[str, str]:
    """gfx target -> family, from the manifest shipped in the wheel."""
    text = resources.files("rocmdoctor.bundles").joinpath("manifest.toml").read_text(encoding="utf-8")
    families = tomllib.loads(text).get("families", {})
    return {
        target: family
        for family, entry in families.items()
        for target in (entry.get("targets", []) if isinstance(entry, dict) else [])
    }


def family_for_gfx(gfx: str | None) -> str | None:
    """The bundle family a gfx target runs with, or None when no bundle exists for it."""
    return _targets().get(gfx) if gfx else None


def family_names() -> list[str]:
    """In the manifest's order (the order people see them in messages)."""
    return list(dict.fromkeys(_targets().values()))
