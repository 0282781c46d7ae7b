"""Which GPUs vLLM serves on a host with several: the one rule the checks and the layouts share.

Pure. The checks (memory.gpu, memory.ttm, kernel.cwsr) judge the GPUs this rule picks and the server
commands (`unit`, `serve`, `instances`) pin the same ones, so the report and the unit cannot disagree.

The rule: GPUs with a bundle family only; of those the discrete ones when there are any (a supported
dGPU beside an iGPU is the serving GPU: the ordinary Ryzen desktop with a Radeon 780M beside an R9700,
or a Strix Halo with an R9700 eGPU); then, when GPUs of more than one family remain, the choice is
ambiguous: nothing picks by enumeration order, the operator picks with `--gpu` (a PCI slot or a KFD
node) or `--family`.

Identity: a GPU is named by its KFD node, its PCI slot and its render node, and by the index the serving
stack uses: ROCR_VISIBLE_DEVICES counts every GPU node in KFD node order (provision/server/layout.py says why),
and after the pin vLLM sees the pinned GPUs as devices 0..n-1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class Node(Protocol):
    @property
    def apu(self) -> bool | None: ...

    @property
    def family(self) -> str | None: ...


NodeT = TypeVar("NodeT", bound=Node)


def serving_nodes(nodes: Sequence[NodeT]) -> list[NodeT]:
    """The GPU nodes vLLM will run on: those with a bundle family, discrete ones first (a supported dGPU
    beside an iGPU is the one the unit pins); all nodes when none has a bundle."""
    supported = [n for n in nodes if n.family]
    if not supported:
        return list(nodes)
    discrete = [n for n in supported if n.apu is False]
    return discrete or supported


def serving_families(nodes: Sequence[NodeT]) -> list[str]:
    """The bundle families among the serving nodes, in node order: more than one is ambiguous."""
    return list(dict.fromkeys(n.family for n in serving_nodes(nodes) if n.family))


def ambiguous(nodes: Sequence[NodeT]) -> bool:
    return len(serving_families(nodes)) > 1


def gpu_spec_matches(spec: str, kfd_node: int, pci_slot: str | None) -> bool:
    """`--gpu` values: a PCI slot (`0000:03:00.0`, or `03:00.0` in domain 0), or a KFD node (`node:2`, `2`)."""
    text = spec.strip().lower()
    if text.startswith("node:"):
        text = text[5:]
    if text.isdigit():
        return int(text) == kfd_node
    if pci_slot is None:
        return False
    slot = pci_slot.lower()
    return text == slot or (slot.startswith("0000:") and text == slot[5:])


def gpu_spec_valid(spec: str) -> bool:
    text = spec.strip().lower().removeprefix("node:")
    if text.isdigit():
        return True
    parts = text.split(":")
    return len(parts) in (2, 3) and all(p.replace(".", "").isalnum() for p in parts) and "." in parts[-1]
