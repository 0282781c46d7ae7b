"""What `rocmdoctor snapshot` needs from the diagnosis, computed here so the core never imports checks."""

from __future__ import annotations

from rocmdoctor.checks import load_registry as registry
from rocmdoctor.checks.access import find_account
from rocmdoctor.checks.disk import measured_paths
from rocmdoctor.checks.multi_gpu import DEV_SHM
from rocmdoctor.checks.processes import read_proc, redact
from rocmdoctor.process_identity import process_table
from rocmdoctor.registry import CheckSpec, Context
from rocmdoctor.snapshot import CaptureFacts, snapshot_users


def capture_facts(ctx: Context, specs: list[CheckSpec]) -> CaptureFacts:
    """After a real run of `specs` with the user's options, so the capture holds what it read."""
    registry().run(ctx, specs)
    table = process_table(ctx.host)
    procs = (read_proc(ctx, pid, table) for pid in ctx.host.pids())
    accounts = (find_account(ctx, user) for user in snapshot_users(ctx))
    return CaptureFacts(
        reported_pids=frozenset(p.pid for p in procs if p and (p.is_vllm or p.gpu_fds)),
        account_gids=frozenset(a.gid for a in accounts if a),
        measured_paths=(*measured_paths(ctx), DEV_SHM),  # env.multi_gpu weighs /dev/shm's free space
        redact=redact,
        read_paths=frozenset(ctx.host.accessed),
    )
