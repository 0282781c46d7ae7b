"""checks/data/host_rules.json: the multi-GPU, kernel-combination and ROCm-layout knowledge, with sources."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any


@lru_cache(maxsize=1)
def rules() -> dict[str, Any]:
    text = resources.files("rocmdoctor.checks").joinpath("data", "host_rules.json").read_text()
    return json.loads(text)
