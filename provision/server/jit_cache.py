"""JIT caches owned by the service, keyed by the bundle and the GPU they were built for.

Triton, inductor, vLLM and AITER reuse whatever they find: a truncated AITER build is reused forever
(aiter#4799), objects built for another GPU segfault (aiter#3846), and their defaults
(`/tmp/torchinductor_<user>`, `~/.triton`) vanish at every restart of a unit with PrivateTmp and
ProtectHome. So every cache lives under `<state>/jit/<key>/`, key = `<gfx>-<digest prefix>`, with a
`fingerprint.json` naming the bundle digest, gfx and tag it belongs to: a new bundle or another GPU
gets a new, empty directory, never a poisoned one.

The unit reads the variables from `<prefix>/current/.rocmdoctor-jit.env` (written into each bundle
when it is qualified: an EnvironmentFile= overrides the unit's Environment= lines), so switching
`current` switches the caches with it; `serve` sets them itself under its cache directory.
"""

from __future__ import annotations

import time
from pathlib import Path

from rocmdoctor.host import Host
from rocmdoctor.host_removal import OwnDir, RemovalRefused
from rocmdoctor.host_writes import HostWriter, OwnedTrees
from rocmdoctor.model import Change, state_diff
from rocmdoctor.process_identity import processes_using

ENV_FILE = ".rocmdoctor-jit.env"
FINGERPRINT = "fingerprint.json"
UNIT_STATE_DIR = "/var/lib/vllm"  # StateDirectory=vllm of the unit (provision/server/unit.py STATE_NAME)
# variable -> subdirectory of the key directory
VARIABLES = {
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "VLLM_CACHE_ROOT": "vllm",
    "AITER_JIT_DIR": "aiter",
}


def cache_key(digest: str, gfx: str | None) -> str:
    return f"{gfx or 'nogpu'}-{digest.split(':', 1)[-1][:16]}"


def cache_dir(state_dir: str | Path, digest: str, gfx: str | None) -> Path:
    return Path(state_dir) / "jit" / cache_key(digest, gfx)


def environment(key_dir: str | Path) -> dict[str, str]:
    return {name: f"{key_dir}/{sub}" for name, sub in VARIABLES.items()}


def fingerprint(digest: str, gfx: str | None, tag: str) -> dict[str, str | None]:
    return {"bundle_digest": digest, "gfx": gfx, "tag": tag}


def write_bundle_env(trees: OwnedTrees, tree: Path, digest: str, gfx: str | None) -> None:
    """The unit's cache variables for this bundle on this GPU, as an EnvironmentFile in the bundle."""
    key_dir = cache_dir(UNIT_STATE_DIR, digest, gfx)
    lines = [f"# rocmdoctor: JIT caches of this bundle on {gfx or 'no GPU'} (read by vllm.service)"]
    lines += [f"{name}={value}" for name, value in environment(key_dir).items()]
    trees.write_atomic(tree / ENV_FILE, "\n".join(lines) + "\n")


def prepare(trees: OwnedTrees, state_dir: Path, digest: str, gfx: str | None, tag: str) -> dict[str, str]:
    """`serve`: make the key directory with its fingerprint (once) and return the variables."""
    key_dir = cache_dir(state_dir, digest, gfx)
    trees.make_dirs(key_dir)
    if not trees.exists(key_dir / FINGERPRINT):
        doc = {**fingerprint(digest, gfx, tag), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        trees.write_json(key_dir / FINGERPRINT, doc)
    return environment(key_dir)


PurgeRefused = RemovalRefused  # `bundle cache purge` maps it to a clear error (exit 2)


def purge(writer: HostWriter, state_dir: Path, keep_key: str | None) -> Change:
    """Remove every cache directory under `<state_dir>/jit` but `keep_key` (None: all of them) and but
    those a live process uses (a file open or mapped, its working directory, or a cache variable of
    its environment naming it: a running server's cache is never pulled from under it). Walked with
    extraction's no-follow rules (host_removal): PurgeRefused when `jit` is a link, a link inside is
    removed and never followed, so the purge never leaves the cache's own tree."""
    jit = state_dir / "jit"
    with OwnDir(state_dir, "jit") as own:
        names = own.names()
        candidates = [n for n in names if n != keep_key]
        trees = {n: tuple(p for p in (str(jit / n), own.kernel_path(n)) if p) for n in candidates}
        in_use = processes_using(Host(), trees, tuple(VARIABLES)) if candidates else {}
        doomed = [n for n in candidates if n not in in_use]
        for name in doomed:
            if writer.change("remove", str(jit / name)):
                own.remove(name)
    kept = [n for n in names if n not in doomed]
    verb = writer.past("removed", "remove")
    busy = "".join(f"; kept {n}, in use by {', '.join(who)}" for n, who in sorted(in_use.items()))
    return Change(
        bool(doomed),
        f"{verb} {len(doomed)} JIT cache(s) under {jit}"
        + (f"; kept {keep_key}" if keep_key in names else "")
        + busy,
        state_diff({"caches": names}, {"caches": kept}),
        data={"removed": doomed, "kept": kept, "in_use": in_use},
    )
