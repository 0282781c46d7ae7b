"""Leftover vLLM engines and other processes holding the GPU, and a process already on the serving port."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rocmdoctor.checks import check
from rocmdoctor.checks.facts import sentence
from rocmdoctor.model import Probe, Result, Severity, passed, warned
from rocmdoctor.process_identity import PROC_READS as IDENTITY_READS
from rocmdoctor.process_identity import ProcessFacts, process_table, vllm_reason
from rocmdoctor.registry import Context
from rocmdoctor.sensitive import redact_argv
from rocmdoctor.textnum import is_decimal

PROC_READS = (
    *IDENTITY_READS,
    "/proc/[0-9]*/comm",
    "/proc/[0-9]*/fd/*",
    "/proc/net/tcp",
    "/proc/net/tcp6",
)
TCP_LISTEN = "0A"
GPU_DEVICES = ("/dev/kfd",)


@dataclass
class Proc:
    pid: int
    comm: str
    cmdline: str
    ppid: int | None
    gpu_fds: int = 0
    sockets: set[int] = field(default_factory=set)
    fds_denied: bool = False  # its open files could not be listed (another user's, without root)
    # Why its identity says vLLM (rocmdoctor.process_identity: executable, entry module, control group,
    # parent chain), or None: a command line or a title alone never makes a process vLLM.
    vllm_why: str | None = None

    @property
    def is_vllm(self) -> bool:
        return self.vllm_why is not None

    def label(self) -> str:
        name = self.cmdline.split(" ")[0] if self.cmdline.startswith("VLLM::") else self.comm
        return f"{self.pid} ({name})"


def redact(cmdline: str) -> str:
    """A command line fit for a report (rocmdoctor.sensitive's rules); `cmdline` is /proc's NUL-separated
    argv, so a value holding spaces is redacted whole."""
    return " ".join(redact_argv(cmdline.rstrip("\x00").split("\x00"))).strip()


def read_proc(ctx: Context, pid: int, table: Mapping[int, ProcessFacts] | None = None) -> Proc | None:
    """One process of the host; with `table` (process_identity.process_table), judged by its identity."""
    comm = ctx.host.read_text(f"/proc/{pid}/comm", limit=256)
    if not comm.ok:
        return None
    cmd = ctx.host.read_text(f"/proc/{pid}/cmdline", limit=4096)
    # Redacted as it is read, from the argv (a space-joined line loses where a value ends).
    cmdline = redact(cmd.value) if cmd.ok else ""
    ppid = None
    status = ctx.host.read_text(f"/proc/{pid}/status", limit=16384)
    if status.ok:
        for line in status.value.splitlines():
            if line.startswith("PPid:") and is_decimal(line[5:].strip()):
                ppid = int(line[5:].strip())
                break
    proc = Proc(pid, comm.value.strip(), cmdline, ppid)
    if table is not None and pid in table:
        proc.vllm_why = vllm_reason(ctx.host, table[pid], table)
    proc.fds_denied = ctx.host.listdir_denied(f"/proc/{pid}/fd")
    for fd in ctx.host.listdir(f"/proc/{pid}/fd"):
        target = ctx.host.readlink(f"/proc/{pid}/fd/{fd}")
        if not target.ok:
            continue
        if target.value in GPU_DEVICES:
            proc.gpu_fds += 1
        elif target.value.startswith("socket:[") and is_decimal(target.value[8:-1]):
            proc.sockets.add(int(target.value[8:-1]))
    return proc


def listening_inodes(ctx: Context, port: int) -> set[int]:
    """Socket inodes listening on `port` (IPv4 and IPv6) from /proc/net/tcp{,6}."""
    inodes = set()
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        raw = ctx.host.read_text(path)
        if not raw.ok:
            continue
        for line in raw.value.splitlines()[1:]:
            cols = line.split()
            if len(cols) < 10 or cols[3] != TCP_LISTEN:
                continue
            try:
                local_port = int(cols[1].rsplit(":", 1)[1], 16)
                inode = int(cols[9])
            except (IndexError, ValueError):
                continue
            if local_port == port:
                inodes.add(inode)
    return inodes


@check(
    "processes.orphans",
    "No leftover vLLM or GPU-holding processes; serving port free",
    severity=Severity.DEGRADING,
    probe=Probe.PROCESS,
    reads=("/proc", *PROC_READS),
)
def processes_orphans(ctx: Context) -> Result:
    table = process_table(ctx.host)
    procs = [p for p in (read_proc(ctx, pid, table) for pid in ctx.host.pids()) if p is not None]
    holders = [p for p in procs if p.is_vllm or p.gpu_fds]
    port = ctx.options.port
    inodes = listening_inodes(ctx, port)
    on_port = [p for p in procs if p.sockets & inodes]
    details = {
        "gpu_processes": [
            {
                "pid": p.pid,
                "comm": p.comm,
                "cmdline": p.cmdline[:200],
                "ppid": p.ppid,
                "kfd_fds": p.gpu_fds,
                "vllm": p.is_vllm,
                "identity": p.vllm_why,
            }
            for p in holders
        ],
        "port": port,
        "port_listeners": [p.pid for p in on_port],
        "port_in_use": bool(inodes),
    }
    problems, remedies = [], []
    if holders:
        described = []
        for p in holders:
            why = [
                w
                for w, hit in (
                    ("orphaned: parent is PID 1", p.ppid == 1 and p.is_vllm),
                    ("holds /dev/kfd", p.gpu_fds > 0),
                )
                if hit
            ]
            described.append(p.label() + (f" [{', '.join(why)}]" if why else ""))
        problems.append("processes holding the GPU: " + ", ".join(described))
        remedies.append(
            f"stop them (`kill {' '.join(str(p.pid) for p in holders)}`, then `kill -9` what remains)"
        )
    if inodes:
        who = ", ".join(p.label() for p in on_port) or "a process rocmdoctor cannot see (run as root)"
        problems.append(f"port {port} is already in use by {who}")
        remedies.append(f"free port {port} or serve on another (--port)")
    hidden = [p.pid for p in procs if p.fds_denied]
    if hidden:
        # Said, not guessed: without root (or CAP_SYS_PTRACE) another user's open files are not ours to see.
        details["unreadable"] = hidden
        unseen = f"the open files of {len(hidden)} process(es) of other users could not be read (run as root to see them)"
        if problems:
            problems.append(unseen)
        else:
            return passed(
                f"no vLLM or other process this user can see holds the GPU; port {port} is free; {unseen}",
                **details,
            )
    if problems:
        return warned("; ".join(problems), sentence(remedies), **details)
    return passed(f"no vLLM or other process holds the GPU; port {port} is free", **details)
