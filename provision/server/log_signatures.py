"""Known ways a vLLM start fails on ROCm, recognised in the server log, each with what to do."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Cause:
    id: str
    summary: str
    remedy: str
    evidence: str = ""  # the log line that matched

    def to_json(self) -> dict:
        return {"id": self.id, "summary": self.summary, "remedy": self.remedy, "evidence": self.evidence}


# Most specific first: an out-of-memory line often follows the real cause.
SIGNATURES: tuple[tuple[str, re.Pattern, str, str], ...] = (
    (
        "free-memory-at-startup",
        re.compile(
            r"Free memory on device .* on startup is less than desired GPU memory utilization"
            r"|Available memory on node .* on startup is less than desired CPU memory utilization"
        ),
        "less memory was free at startup than --gpu-memory-utilization asks for (vLLM's startup rule)",
        "Let rocmdoctor compute --gpu-memory-utilization (do not pass it), or stop the processes holding GPU "
        "memory: `rocmdoctor check` lists them; an interrupted earlier start can leave VLLM::EngineCore behind.",
    ),
    (
        "invalid-image",
        re.compile(r"hipErrorInvalidImage|invalid device image|no kernel image is available"),
        "the bundle has no GPU code for this GPU's architecture (hipErrorInvalidImage)",
        "Install the bundle built for this GPU family (`rocmdoctor check` names it; `rocmdoctor install "
        "--family F`); a bundle that lost its hidden .kpack files fails the same way.",
    ),
    (
        "amdsmi-file-error",
        re.compile(r"AMDSMI_STATUS_FILE_ERROR|AMDSMI_STATUS_NO_PERM"),
        "amdsmi could not open the GPU's device files: the user is missing the render/video groups",
        "Add the service user to the render and video groups (`usermod -aG render,video USER`, then log in "
        "again); `rocmdoctor check` shows which group /dev/kfd and /dev/dri/renderD* need.",
    ),
    (
        "cwsr",
        re.compile(r"\bCWSR\b|cwsr_enable", re.IGNORECASE),
        "the kernel's compute wave save/restore (CWSR) path failed, a known gfx1151 kernel problem",
        "Run `rocmdoctor fix-kernel` for the kernel parameters this GPU needs (e.g. amdgpu.cwsr_enable=0) "
        "or move to a fixed kernel.",
    ),
    (
        "max-model-len",
        re.compile(r"the estimated maximum model length is (\d+)"),
        "the KV cache cannot hold one sequence of the model's full context length",
        "Pass --max-model-len {0} (or less), or free memory for a larger KV cache.",
    ),
    (
        "no-kv-cache",
        re.compile(r"No available memory for the cache blocks"),
        "no memory was left for the KV cache after loading the weights",
        "Use a smaller model or a quantized one, or stop other processes holding GPU memory.",
    ),
    (
        "unsupported-attention",
        re.compile(
            r"Unsupported (?:CPU )?attention configuration[^\n]*|[Uu]nsupported head[_ ]?(?:size|dim)[^\n]*"
        ),
        "the model's attention configuration (head_dim) is not supported by this vLLM build's attention backend",
        "Serve a model whose head_dim the backend supports (64, 128, ... on ROCm/CPU), or pick another attention "
        "backend with --attention-backend.",
    ),
    (
        "out-of-memory",
        re.compile(r"OutOfMemoryError|(?:HIP|CUDA|GPU) out of memory|hipErrorOutOfMemory|[Oo]ut of memory"),
        "the GPU ran out of memory while loading or warming up",
        "Lower --max-model-len or --max-num-seqs, use a smaller or quantized model, or stop other GPU users.",
    ),
)


def diagnose(log_text: str, returncode: int | None = None) -> Cause | None:
    """The first known signature in the log; SIGKILL with no signature points at the OOM killer."""
    for cause_id, pattern, summary, remedy in SIGNATURES:
        match = pattern.search(log_text)
        if match:
            line_start = log_text.rfind("\n", 0, match.start()) + 1
            line_end = log_text.find("\n", match.end())
            evidence = log_text[line_start : line_end if line_end >= 0 else None].strip()
            return Cause(cause_id, summary, remedy.format(*match.groups()), evidence[:400])
    if returncode == -9:
        return Cause(
            "killed",
            "the server was killed with SIGKILL, most often by the kernel's OOM killer",
            "Check `journalctl -k | grep -i oom`; lower --max-model-len or use a smaller model.",
        )
    return None
