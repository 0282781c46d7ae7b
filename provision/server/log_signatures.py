"""Why a vLLM start failed, from its log: the first known cause (vllm/data/log_signatures.json, the table
`rocmdoctor explain` reads too), each with what to do."""

from __future__ import annotations

from dataclasses import dataclass

from rocmdoctor.vllm.log_signatures import match_line, signatures


@dataclass(frozen=True, slots=True)
class Cause:
    id: str
    summary: str
    remedy: str
    evidence: str = ""  # the log line that matched

    def to_json(self) -> dict:
        return {"id": self.id, "summary": self.summary, "remedy": self.remedy, "evidence": self.evidence}


def diagnose(log_text: str, returncode: int | None = None) -> Cause | None:
    """The highest-priority known cause in the log (a root cause before the out-of-memory that often
    follows it); SIGKILL with no signature points at the OOM killer."""
    rank = {s.id: i for i, s in enumerate(signatures())}
    best = None
    for line in log_text.splitlines():
        found = match_line(line)
        if found is not None and (best is None or rank[found.signature.id] < rank[best[0].signature.id]):
            best = (found, line)
    if best is not None:
        found, line = best
        sig = found.signature
        return Cause(sig.id, sig.summary, sig.remedy_for(found.match), line.strip()[:400])
    if returncode == -9:
        return Cause(
            "killed",
            "the server was killed with SIGKILL, most often by the kernel's OOM killer",
            "Check `journalctl -k | grep -i oom`; lower --max-model-len or use a smaller model.",
        )
    return None
