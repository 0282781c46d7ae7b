"""Plan, fetch, verify, extract, validate and activate a bundle under a prefix; roll back; list.

Layout under <prefix>:
    bundles/<tag>/                 complete, validated trees (each with .rocmdoctor-bundle.json)
    bundles/<tag>.partial/         extraction in progress (never pointed at; removed on the next run)
    bundles/.downloads/<tag>/      parts being downloaded (kept on failure so a rerun resumes)
    current -> bundles/<tag>       switched atomically (symlink to a temp name, then os.replace);
                                   a live tag is replaced by swapping trees (RENAME_EXCHANGE)
    previous -> bundles/<tag>      what `rollback` returns to
    .install.lock                  flock: one install at a time

Every failure leaves `current` as it was and raises InstallError with what to do next.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import fsync_dir, write_atomic
from .download import (
    DownloadCancelled,
    Downloader,
    DownloadError,
    DownloadOptions,
    PartFile,
    PartStream,
    StreamCancelled,
    StreamRestarted,
    verify_local,
)
from .extract import ArchiveError, UnsafeArchive, extract_stream, fix_exec_bits
from .manifest import Asset

ProgressFn = Callable[[int], None]
METADATA = ".rocmdoctor-bundle.json"
VALIDATE_TIMEOUT_S = 120


class InstallError(RuntimeError):
    """An install step failed; the message ends with what to do next. `current` is unchanged."""


@dataclass(frozen=True)
class Source:
    """Where one part comes from: a URL to download, or a file already on disk (a mirror directory)."""

    asset: Asset
    url: str | None = None
    local: Path | None = None


@dataclass
class InstallPlan:
    prefix: Path
    family: str
    tag: str
    repo: str
    sources: list[Source]
    force: bool = False
    precompile: bool = False
    download: DownloadOptions = field(default_factory=DownloadOptions)
    download_dir: Path | None = None  # where parts are staged; default <prefix>/bundles/.downloads
    extractor: str = "auto"  # auto | tar | python, see extract.extract_stream
    on_download: ProgressFn | None = None
    on_extract: ProgressFn | None = None

    @property
    def total_bytes(self) -> int:
        return sum(s.asset.size for s in self.sources)


@dataclass
class InstallResult:
    changed: bool
    msg: str
    tag: str
    current: str | None
    previous: str | None
    family: str
    path: str
    downloaded_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": 1, **asdict(self)}


class Layout:
    def __init__(self, prefix: Path) -> None:
        self.prefix = Path(prefix)
        self.bundles = self.prefix / "bundles"
        self.current = self.prefix / "current"
        self.previous = self.prefix / "previous"
        self.downloads = self.bundles / ".downloads"
        self.lock_path = self.prefix / ".install.lock"

    def _target_tag(self, link: Path) -> str | None:
        try:
            target = os.readlink(link)
        except OSError:
            return None
        return Path(target).name

    def current_tag(self) -> str | None:
        return self._target_tag(self.current)

    def previous_tag(self) -> str | None:
        return self._target_tag(self.previous)

    def metadata(self, tag: str) -> dict[str, Any] | None:
        """The bundle's metadata; None when it is missing or not a JSON object (an incomplete bundle)."""
        try:
            meta = json.loads((self.bundles / tag / METADATA).read_text())
        except (OSError, ValueError):
            return None
        return meta if isinstance(meta, dict) else None

    def installed(self) -> list[dict[str, Any]]:
        if not self.bundles.is_dir():
            return []
        current, previous = self.current_tag(), self.previous_tag()
        found = []
        for entry in sorted(self.bundles.iterdir()):
            if entry.name.startswith(".") or entry.name.endswith(".partial") or not entry.is_dir():
                continue
            meta = self.metadata(entry.name) or {}
            found.append(
                {
                    "tag": entry.name,
                    "family": meta.get("family"),
                    "installed_at": meta.get("installed_at"),
                    "path": str(entry),
                    "current": entry.name == current,
                    "previous": entry.name == previous,
                    "complete": bool(meta),
                }
            )
        return found


@dataclass
class _Held:
    fd: int


def _lock(layout: Layout) -> _Held:
    try:
        layout.prefix.mkdir(parents=True, exist_ok=True)
        fd = os.open(layout.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise InstallError(
            f"cannot use {layout.prefix}: {exc.strerror or exc}; pick a writable --prefix (or run as root)"
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise InstallError(
            f"another rocmdoctor install holds {layout.lock_path}; wait for it to finish and rerun"
        ) from None
    return _Held(fd)


def _unlock(held: _Held) -> None:
    os.close(held.fd)  # closing drops the flock


def _point(link: Path, target: str) -> None:
    """Atomically make `link` a symlink to `target` (never absent, never half-written)."""
    temp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    temp.unlink(missing_ok=True)
    os.symlink(target, temp)
    os.replace(temp, link)
    fsync_dir(link.parent)


def write_json_atomic(path: Path, doc: Any) -> None:
    write_atomic(path, json.dumps(doc, indent=2) + "\n")


def recover(layout: Layout) -> None:
    """Undo what a killed run left: partial trees, half-swapped bundles, temp links."""
    if not layout.bundles.is_dir():
        return
    for entry in layout.bundles.iterdir():
        if entry.name.endswith(".partial"):
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.name.startswith(".") and ".old-" in entry.name:
            original = layout.bundles / entry.name[1:].rsplit(".old-", 1)[0]
            if original.exists():
                shutil.rmtree(entry, ignore_errors=True)
            else:  # killed between moving the old tree aside and moving the new one in
                os.replace(entry, original)
    for temp in layout.prefix.glob(".*.tmp-*"):
        temp.unlink(missing_ok=True)


def _matches(meta: dict[str, Any] | None, plan: InstallPlan) -> bool:
    if not meta:
        return False
    want = [(s.asset.name, s.asset.digest) for s in plan.sources]
    return [(a.get("name"), a.get("digest")) for a in meta.get("assets", [])] == want


def install(plan: InstallPlan) -> InstallResult:
    layout = Layout(plan.prefix)
    held = _lock(layout)
    try:
        recover(layout)
        current = layout.current_tag()
        if not plan.force and current == plan.tag and _matches(layout.metadata(plan.tag), plan):
            return _result(layout, plan, False, f"{plan.tag} is already current")
        if not plan.force and _matches(layout.metadata(plan.tag), plan):
            _activate(layout, plan.tag)
            return _result(layout, plan, True, f"switched to the installed {plan.tag}")
        downloaded = _install_tree(layout, plan)
        _activate(layout, plan.tag)
        shutil.rmtree(_staging(layout, plan), ignore_errors=True)
        result = _result(layout, plan, True, f"installed {plan.tag}")
        result.downloaded_bytes = downloaded
        return result
    except OSError as exc:
        raise InstallError(_os_failure(exc, layout)) from None
    finally:
        _unlock(held)


def _os_failure(exc: OSError, layout: Layout) -> str:
    import errno

    if exc.errno == errno.ENOSPC:
        return (
            f"no space left on the device holding {layout.prefix}; the previous bundle is still active. "
            "Free space (or choose another --prefix) and rerun: finished downloads are kept"
        )
    return f"{exc.strerror or exc} ({exc.filename or layout.prefix}); the previous bundle is still active"


def _result(layout: Layout, plan: InstallPlan, changed: bool, msg: str) -> InstallResult:
    return InstallResult(
        changed,
        msg,
        plan.tag,
        layout.current_tag(),
        layout.previous_tag(),
        plan.family,
        str(layout.bundles / plan.tag),
    )


def _staging(layout: Layout, plan: InstallPlan) -> Path:
    return (plan.download_dir or layout.downloads) / plan.tag


class _Fetches:
    """The parts' downloads (or local verifications), running beside the extraction."""

    def __init__(self, layout: Layout, plan: InstallPlan) -> None:
        self.dest = _staging(layout, plan)
        self.dest.mkdir(parents=True, exist_ok=True)
        self.counted = 0
        self._count_lock = threading.Lock()
        self.downloader = Downloader(plan.download, self._on_bytes)
        self.on_download = plan.on_download
        self.parts = [PartFile(s.asset, self.dest / s.asset.name) for s in plan.sources]
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=min(4, len(self.parts)), thread_name_prefix="fetch"
        )
        self.futures = [
            self.pool.submit(self._one, part, source) for part, source in zip(self.parts, plan.sources)
        ]

    def _on_bytes(self, n: int) -> None:
        with self._count_lock:
            self.counted += n
        if self.on_download:
            self.on_download(n)

    def _one(self, part: PartFile, source: Source) -> None:
        if source.local is not None:
            verify_local(part, source.local, self.on_download)
        else:
            self.downloader.fetch(part, source.url or "", self.dest)

    def wait(self) -> None:
        """The first failure, by part order, as an InstallError."""
        errors = []
        for future in self.futures:
            try:
                future.result()
            except DownloadError as exc:
                errors.append(exc)
            except (DownloadCancelled, concurrent.futures.CancelledError):
                pass
        self.pool.shutdown()
        if errors:
            raise InstallError(f"{errors[0]}. Nothing was activated; the previous bundle is still active")

    def cancel(self) -> None:
        self.downloader.cancel()
        for future in self.futures:
            future.cancel()
        self.pool.shutdown(wait=True)


def _install_tree(layout: Layout, plan: InstallPlan) -> int:
    """Download + extract into <tag>.partial, verify, validate, rename to <tag>. Returns bytes fetched."""
    partial = layout.bundles / f"{plan.tag}.partial"
    fetches = _Fetches(layout, plan)
    try:
        partial.mkdir(parents=True)
        try:
            extract_stream(PartStream(fetches.parts), partial, plan.on_extract, plan.extractor)
        except StreamRestarted:
            # A part started over after extraction had read it: extract again from the finished files.
            fetches.wait()
            shutil.rmtree(partial)
            partial.mkdir()
            extract_stream(PartStream(fetches.parts), partial, plan.on_extract, plan.extractor)
        except (DownloadError, StreamCancelled):
            fetches.wait()
            raise
        except (ArchiveError, UnsafeArchive) as exc:
            # A corrupt archive is usually a corrupt download: let the parts finish so the error
            # names the part whose digest is wrong rather than tar's symptom.
            fetches.wait()
            raise InstallError(
                f"{exc}. Nothing was activated; the previous bundle is still active. "
                "Report this bundle to its publisher"
            ) from None
        fetches.wait()  # every digest verified before the tree can become visible
        root = _validate(partial, plan)
        write_json_atomic(
            root / METADATA,
            {
                "schema_version": 1,
                "tag": plan.tag,
                "family": plan.family,
                "repo": plan.repo,
                "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "assets": [
                    {"name": s.asset.name, "size": s.asset.size, "digest": s.asset.digest}
                    for s in plan.sources
                ],
            },
        )
        fsync_dir(root)
        _move_into_place(layout, root, plan.tag)
        return fetches.counted
    except BaseException:
        fetches.cancel()
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _bundle_root(partial: Path) -> Path:
    """The tree itself, or its single top-level directory when the tarball wraps one."""
    if (partial / "bin").is_dir():
        return partial
    entries = [e for e in partial.iterdir()]
    if (
        len(entries) == 1
        and entries[0].is_dir()
        and not entries[0].is_symlink()
        and (entries[0] / "bin").is_dir()
    ):
        return entries[0]
    return partial


def _validate(partial: Path, plan: InstallPlan) -> Path:
    root = _bundle_root(partial)
    missing = [name for name in ("bin/vllm-server", "bin/python3") if not (root / name).is_file()]
    if missing:
        raise InstallError(
            f"the extracted {plan.tag} lacks {', '.join(missing)}: not a vllm-rocm bundle. "
            "Nothing was activated; check the tag and the pins (`rocmdoctor bundle lock`)"
        )
    fix_exec_bits(root)
    python = root / "bin" / "python3"
    commands = [[str(python), "-c", "pass"]]
    if plan.precompile:
        commands.append([str(python), "-m", "compileall", "-q", "-j0", *map(str, root.glob("lib/python3.*"))])
    for command in commands:
        try:
            done = subprocess.run(  # noqa: PLW1510 - the exit status is judged below
                command, capture_output=True, text=True, timeout=VALIDATE_TIMEOUT_S, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise InstallError(
                f"the bundle's interpreter does not run ({exc}). Nothing was activated; "
                "the previous bundle is still active"
            ) from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise InstallError(
                f"`{' '.join(command[1:3])}` in the new bundle failed (exit {done.returncode}: "
                f"{' / '.join(tail)}). Nothing was activated; the previous bundle is still active"
            )
    return root


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (renameat2 RENAME_EXCHANGE); False where unsupported."""
    import ctypes
    import errno

    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _move_into_place(layout: Layout, root: Path, tag: str) -> None:
    final = layout.bundles / tag
    if final.exists() and _exchange(root, final):
        # --force or a rebuilt release: `current` saw the old tree, then the new one, never nothing.
        fsync_dir(layout.bundles)
        shutil.rmtree(root)  # now the old tree
    else:
        aside = layout.bundles / f".{tag}.old-{os.getpid()}"
        if final.exists():  # no RENAME_EXCHANGE here: keep the old tree until the new one is in
            os.replace(final, aside)
        os.replace(root, final)
        fsync_dir(layout.bundles)
        shutil.rmtree(aside, ignore_errors=True)
    partial = layout.bundles / f"{tag}.partial"
    if partial.exists():
        shutil.rmtree(partial)


def _activate(layout: Layout, tag: str) -> None:
    old = layout.current_tag()
    if old and old != tag and (layout.bundles / old).is_dir():
        _point(layout.previous, f"bundles/{old}")
    _point(layout.current, f"bundles/{tag}")


def rollback(prefix: Path, to: str | None = None) -> InstallResult:
    layout = Layout(prefix)
    held = _lock(layout)
    try:
        recover(layout)
        current = layout.current_tag()
        target = to or layout.previous_tag()
        if target is None:
            raise InstallError(
                f"no previous bundle under {prefix} to roll back to; `rocmdoctor bundles` "
                "lists what is installed"
            )
        if layout.metadata(target) is None:  # missing, or not a JSON object
            raise InstallError(
                f"{target} is not a complete bundle under {layout.bundles} (no valid {METADATA}); "
                "`rocmdoctor bundles` lists what is installed"
            )
        family = (layout.metadata(target) or {}).get("family") or ""
        if target == current:
            return InstallResult(
                False,
                f"{target} is already current",
                target,
                current,
                layout.previous_tag(),
                family,
                str(layout.bundles / target),
            )
        _activate(layout, target)
        return InstallResult(
            True,
            f"switched from {current} to {target}",
            target,
            layout.current_tag(),
            layout.previous_tag(),
            family,
            str(layout.bundles / target),
        )
    finally:
        _unlock(held)


def fetch_to(
    sources: list[Source], dest: Path, options: DownloadOptions, on_bytes: ProgressFn | None = None
) -> Iterator[tuple[Asset, bool]]:
    """Fill a mirror directory: yields (asset, downloaded?) per part; parts already there are verified."""
    dest.mkdir(parents=True, exist_ok=True)
    downloader = Downloader(options, on_bytes)
    for source in sources:
        part = PartFile(source.asset, dest / source.asset.name)
        existed = (dest / source.asset.name).exists()
        if source.local is not None:
            verify_local(part, source.local, on_bytes)
            if source.local.resolve() != (dest / source.asset.name).resolve():
                shutil.copyfile(source.local, dest / f"{source.asset.name}.partial")
                os.replace(dest / f"{source.asset.name}.partial", dest / source.asset.name)
        else:
            downloader.fetch(part, source.url or "", dest)
        (dest / f"{source.asset.name}.etag").unlink(missing_ok=True)
        yield source.asset, not existed
