"""Plan, fetch, verify, extract, validate and activate a bundle under a prefix; roll back; list.

Layout under <prefix>:
    bundles/<tag>/                 complete, validated trees (each with .rocmdoctor-bundle.json)
    bundles/<tag>.partial/         extraction in progress (never pointed at; removed on the next run)
    bundles/.downloads/<tag>/      parts being downloaded (kept on failure so a rerun resumes)
    current -> bundles/<tag>       switched atomically (symlink to a temp name, then os.replace);
                                   a live tag is replaced by swapping trees (RENAME_EXCHANGE)
    previous -> bundles/<tag>      what `rollback` returns to
    .install.lock                  flock: one install at a time (also held by rollback and prune)
    lock.json                      the pins this prefix installs (digests trusted on first use land here)

Every failure leaves `current` as it was and raises InstallError with what to do next.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from rocmdoctor import documents
from rocmdoctor.archive.extract import ArchiveError, UnsafeArchive, extract_stream, fix_exec_bits
from rocmdoctor.archive.tar_rule import NoSpaceLeft, human
from rocmdoctor.facts.manifest import ManifestError, check_tag
from rocmdoctor.host_files import ForeignFile
from rocmdoctor.host_processes import run_program
from rocmdoctor.host_writes import HostWriter, OwnedTrees
from rocmdoctor.model import Change, envelope, state_diff
from rocmdoctor.provision.bundle.download import (
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
from rocmdoctor.provision.bundle.manifest import (
    MAX_PART_BYTES,
    Asset,
    Lock,
    LockEntry,
    parse_lock,
    read_pin_file,
    with_entry,
)
from rocmdoctor.provision.bundle.qualify import (
    QualifyOptions,
    newest_qualified,
    qualify_installed,
    qualify_tree,
    rollback_refusal,
)

ProgressFn = Callable[[int], None]
METADATA = ".rocmdoctor-bundle.json"
METADATA_LIMIT = 1 << 20
VALIDATE_TIMEOUT_S = 120
PREFIX_LOCK = "lock.json"


class InstallError(RuntimeError):
    """An install step failed; the message ends with what to do next. `current` is unchanged."""


class UnsafeBundle(InstallError):
    """The verified parts hold an archive that breaks the member rule: bad input from its publisher."""


class MetaAsset(msgspec.Struct, forbid_unknown_fields=False):
    name: str | None = None
    size: Annotated[int, Meta(ge=0, le=MAX_PART_BYTES)] | None = None
    digest: str | None = None


class BundleMeta(msgspec.Struct, forbid_unknown_fields=False):
    """A bundle's .rocmdoctor-bundle.json as install writes it: the fields anything reads, typed (a file
    that does not fit is an incomplete bundle)."""

    tag: str | None = None
    family: str | None = None
    repo: str | None = None
    installed_at: str | None = None
    assets: Annotated[list[MetaAsset], Meta(max_length=1000)] = []


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
    pins: LockEntry | None = None  # digests trusted on first use: recorded in <prefix>/lock.json
    retrust: bool = False  # --retrust-tag: accept digests that differ from those recorded for the tag
    qualify: QualifyOptions = field(default_factory=lambda: QualifyOptions())
    # False: install and qualify beside `current` and leave it where it is (`upgrade` switches later)
    activate: bool = True

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
    check: bool = False
    pins_recorded: str | None = None  # the lock file the release's digests were written to
    notes: list[str] = field(default_factory=list)
    older_bundles: list[dict[str, Any]] = field(default_factory=list)  # neither current nor previous
    older_bundles_bytes: int = 0
    diff: dict[str, Any] = field(default_factory=lambda: state_diff({}, {}))  # Ansible's {before, after}

    def change(self) -> Change:
        fields = asdict(self)
        return Change(fields.pop("changed"), fields.pop("msg"), fields.pop("diff"), fields)

    def to_json(self) -> dict[str, Any]:
        return self.change().envelope()


class Layout:
    """A prefix's paths, and its trees through the command's writer (`writer.trees`); a Layout built
    without one only reads (`bundles`, tune) and refuses every effect."""

    def __init__(self, prefix: Path, trees: OwnedTrees | None = None) -> None:
        self.trees = trees or OwnedTrees(None)
        self.prefix = Path(prefix)
        self.bundles = self.prefix / "bundles"
        self.current = self.prefix / "current"
        self.previous = self.prefix / "previous"
        self.downloads = self.bundles / ".downloads"
        self.lock_path = self.prefix / ".install.lock"

    def _target_tag(self, link: Path) -> str | None:
        target = self.trees.readlink(link)
        return None if target is None else Path(target).name

    def current_tag(self) -> str | None:
        return self._target_tag(self.current)

    def previous_tag(self) -> str | None:
        return self._target_tag(self.previous)

    def metadata(self, tag: str) -> dict[str, Any] | None:
        """The bundle's metadata; None when it is missing or not a JSON object (an incomplete bundle)."""
        from rocmdoctor.rootfs import read_regular as read_regular_file

        where = str(self.bundles / tag / METADATA)
        try:
            raw = read_regular_file(where, METADATA_LIMIT)
            documents.decode(raw, BundleMeta, where, METADATA_LIMIT)  # the fields we read, typed
            return documents.load_object(raw, where, METADATA_LIMIT)
        except (OSError, documents.DocumentError):
            return None

    def installed(self) -> list[dict[str, Any]]:
        if not self.trees.is_dir(self.bundles):
            return []
        current, previous = self.current_tag(), self.previous_tag()
        found = []
        for entry in (self.bundles / name for name in self.trees.list_dir(self.bundles)):
            if entry.name.startswith(".") or entry.name.endswith(".partial") or not self.trees.is_dir(entry):
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


def _lock(layout: Layout, create: bool = True) -> _Held:
    if not create and not layout.trees.is_dir(layout.prefix):
        raise InstallError(f"{layout.prefix} does not exist: nothing is installed there (check --prefix)")
    try:
        if create:
            layout.trees.make_dirs(layout.prefix)
        fd = layout.trees.try_lock(layout.lock_path)
    except BlockingIOError:
        raise InstallError(
            f"another rocmdoctor install holds {layout.lock_path}; wait for it to finish and rerun"
        ) from None
    except OSError as exc:
        raise InstallError(
            f"cannot use {layout.prefix}: {exc.strerror or exc}; pick a writable --prefix (or run as root)"
        ) from None
    return _Held(fd)


def _unlock(layout: Layout, held: _Held) -> None:
    layout.trees.unlock(held.fd)


def _point(layout: Layout, link: Path, target: str) -> None:
    """Atomically make `link` a symlink to `target` (never absent, never half-written)."""
    layout.trees.swap_symlink(link, target)


def write_json_atomic(layout: Layout, path: Path, doc: Any) -> None:
    layout.trees.write_json(path, doc)


def recover(layout: Layout) -> None:
    """Undo what a killed run left: partial trees, half-swapped bundles, temp links."""
    trees = layout.trees
    if not trees.is_dir(layout.bundles):
        return
    for entry in (layout.bundles / name for name in trees.list_dir(layout.bundles)):
        # .partial: a killed extraction; .<tag>.prune-<pid>: a killed prune (finish it)
        if entry.name.endswith(".partial") or (entry.name.startswith(".") and ".prune-" in entry.name):
            _remove_leftover(layout, entry)
        elif entry.name.startswith(".") and ".old-" in entry.name:
            original = layout.bundles / entry.name[1:].rsplit(".old-", 1)[0]
            if trees.exists(original):
                trees.remove_tree(entry, ignore_errors=True)
            else:  # killed between moving the old tree aside and moving the new one in
                trees.replace(entry, original)
    for temp in trees.glob(layout.prefix, ".*.tmp-*"):
        trees.remove(temp)


# A killed run's extractor (GNU tar behind a pipe) outlives it until it reads the pipe's end, and
# may still be creating entries in its tree meanwhile.
ORPHAN_WRITER_WAIT_S = 10.0


def _remove_leftover(layout: Layout, tree: Path) -> None:
    """Remove a killed run's tree, again while an orphaned extractor is still adding to it."""
    deadline = time.monotonic() + ORPHAN_WRITER_WAIT_S
    while True:
        layout.trees.remove_tree(tree, ignore_errors=True)
        if not layout.trees.lexists(tree):
            return
        if time.monotonic() > deadline:
            raise InstallError(
                f"{tree}: left by a killed run and still being written by another process after "
                f"{ORPHAN_WRITER_WAIT_S:.0f} s; stop it (fuser -v {tree}) and run again"
            )
        time.sleep(0.1)


def _matches(meta: dict[str, Any] | None, plan: InstallPlan) -> bool:
    if not meta:
        return False
    want = [(s.asset.name, s.asset.digest) for s in plan.sources]
    return [(a.get("name"), a.get("digest")) for a in meta.get("assets", [])] == want


class InvalidRequest(ValueError):
    """Bad input to install/rollback/prune (a path where a name belongs, a missing prefix): exit 2."""


class DigestChanged(InvalidRequest):
    """The release's digests differ from those this prefix recorded for the same tag: exit 2."""


def decide(layout: Layout, plan: InstallPlan) -> str:
    """What an install does here, the same for the dry run and the real one: "current" (nothing),
    "switch" (the bundle is installed, `current` moves to it) or "install" (fetch, extract, qualify)."""
    meta = layout.metadata(plan.tag) if layout.trees.is_dir(layout.bundles) else None
    if not plan.force and _matches(meta, plan):
        return "current" if layout.current_tag() == plan.tag else "switch"
    return "install"


def install(plan: InstallPlan, writer: HostWriter) -> InstallResult:
    """Install `plan` under its prefix through `writer`: in check mode the same decision is made and
    reported, and nothing under the prefix is created, locked, recovered or moved."""
    layout = Layout(plan.prefix, writer.trees)
    trusted = _check_recorded(layout, plan)  # TOFU, whatever supplied the pins: before any write
    if not writer.change("install", f"{plan.tag} under {layout.prefix}"):
        return _dry_run(layout, plan, decide(layout, plan))
    held = _lock(layout)
    try:
        recover(layout)
        before = layout.current_tag()
        action = decide(layout, plan)
        if action == "current":
            result = _result(layout, plan, False, f"{plan.tag} is already current")
            _record_pins(layout, plan, trusted, result)
        elif action == "switch" and not plan.activate:
            result = _result(layout, plan, False, f"{plan.tag} is installed beside {before}")
            _record_pins(layout, plan, trusted, result)
        elif action == "switch":
            _qualify_staged(layout, plan)
            result = _result(layout, plan, True, f"switched to the installed {plan.tag}")
            _record_pins(layout, plan, trusted, result)  # before `current` moves: a failure leaves it
            _activate(layout, plan.tag)
        else:
            with _download_dir_held(layout, plan):
                downloaded = _install_tree(layout, plan)
            _qualify_staged(layout, plan)
            staged = "" if plan.activate else f" beside {before} (not activated)"
            result = _result(layout, plan, True, f"installed {plan.tag}{staged}")
            _record_pins(layout, plan, trusted, result)  # before `current` moves: a failure leaves it
            if plan.activate:
                _activate(layout, plan.tag)
            layout.trees.remove_tree(_staging(layout, plan), ignore_errors=True)
            result.downloaded_bytes = downloaded
        result.current, result.previous = layout.current_tag(), layout.previous_tag()
        _describe_older(layout, result)
        result.diff = state_diff({"current": before}, {"current": result.current})
        return result
    except OSError as exc:
        raise InstallError(_os_failure(exc, layout)) from None
    finally:
        _unlock(layout, held)


def _dry_run(layout: Layout, plan: InstallPlan, action: str) -> InstallResult:
    """What `install` would do, touching nothing (not even creating the prefix)."""
    before = layout.current_tag()
    if action == "current":
        result = _result(layout, plan, False, f"{plan.tag} is already current")
    elif action == "switch" and not plan.activate:
        result = _result(layout, plan, False, f"{plan.tag} is installed beside {before}")
    elif action == "switch":
        result = _result(layout, plan, True, f"would switch to the installed {plan.tag}")
    else:
        result = _result(
            layout,
            plan,
            True,
            f"would fetch {plan.total_bytes} bytes in {len(plan.sources)} part(s) and install {plan.tag}",
        )
    result.check = True
    if plan.pins is not None and _pins_differ(layout, plan.pins):
        result.changed = True
        result.msg += f"; would record the release's digests in {layout.prefix / PREFIX_LOCK}"
    _describe_older(layout, result)
    result.diff = state_diff({"current": before}, {"current": plan.tag if plan.activate else before})
    return result


def _prefix_lock(layout: Layout) -> Lock | None:
    path = layout.prefix / PREFIX_LOCK
    if not layout.trees.lexists(path):
        return None
    return parse_lock(read_pin_file(path), str(path))


def _same_pins(a: LockEntry, b: LockEntry) -> bool:
    return (a.tag, a.pinned, [(x.name, x.size, x.digest) for x in a.assets]) == (
        b.tag,
        b.pinned,
        [(x.name, x.size, x.digest) for x in b.assets],
    )


def _pins_differ(layout: Layout, pins: LockEntry) -> bool:
    try:
        lock = _prefix_lock(layout)
    except ManifestError:
        return True
    entry = lock.families.get(pins.family) if lock else None
    return entry is None or not _same_pins(entry, pins)


def _wanted_pins(plan: InstallPlan) -> LockEntry | None:
    """What this install records: the release's own pins, else the parts it installs when every one
    carries a digest (a --lock, --bundles-dir, ROCMDOCTOR_BUNDLES or shipped pin)."""
    if plan.pins is not None:
        return plan.pins
    assets = tuple(s.asset for s in plan.sources)
    if assets and all(a.digest for a in assets):
        return LockEntry(plan.family, plan.tag, True, assets)
    return None


def _check_recorded(layout: Layout, plan: InstallPlan) -> Lock | None:
    """The prefix's lock, after checking the parts of `plan.tag` against the digests it recorded for that
    tag: a part whose name or digest changed is DigestChanged (exit 2), naming both digests, unless
    `plan.retrust`. A prefix lock that cannot be read is a ManifestError: nothing is installed past it."""
    lock = _prefix_lock(layout)
    recorded = lock.recorded(plan.tag) if lock else ()
    if not recorded or plan.retrust:
        return lock
    then = {a.name: a.digest for a in recorded}
    now = {s.asset.name: s.asset.digest for s in plan.sources}
    path = layout.prefix / PREFIX_LOCK
    fix = (
        f"Refusing: the release was rebuilt under the same tag, or the pins were changed. If you trust "
        f"the new build, rerun with --retrust-tag {plan.tag}"
    )
    for name in sorted(set(then) | set(now)):
        if name not in now or name not in then:
            raise DigestChanged(
                f"{plan.tag}: its parts are now {sorted(now)}, but {path} recorded {sorted(then)} when "
                f"this prefix first trusted the tag. {fix}"
            )
        if now[name] is not None and now[name] != then[name]:
            raise DigestChanged(
                f"{plan.tag}: part {name} now has digest {now[name]}, but {path} recorded {then[name]} "
                f"when this prefix first trusted the tag. {fix}"
            )
    # A part offered without a digest (an API answer from before 2025-06) is verified against the record.
    plan.sources = [
        s
        if s.asset.digest
        else dataclasses.replace(s, asset=dataclasses.replace(s.asset, digest=then[s.asset.name]))
        for s in plan.sources
    ]
    return lock


def _record_pins(layout: Layout, plan: InstallPlan, lock: Lock | None, result: InstallResult) -> None:
    """Trust on first use: the digests this install verified become the prefix's pins and its record of
    the tag, so the next install (and --frozen) use them and a rebuilt release under the tag is refused.
    Called before `current` moves: if the write fails, the previous bundle is still active."""
    pins = _wanted_pins(plan)
    if pins is None:
        return
    path = layout.prefix / PREFIX_LOCK
    before = lock or Lock(plan.repo, {}, str(path))
    after = before
    entry = before.families.get(pins.family)
    if plan.pins is not None and (entry is None or not _same_pins(entry, plan.pins)):
        after = with_entry(after, plan.pins)
    if _parts(after.recorded(pins.tag)) != _parts(pins.assets):
        after = Lock(after.repo, after.families, after.source, {**after.trusted, pins.tag: pins.assets})
    if after is before:
        return
    write_json_atomic(layout, path, after.to_json())
    if after.families != before.families:
        result.pins_recorded = str(path)
        result.changed = True
        result.msg += (
            f"; recorded the sha256 digests the release publishes for its {len(pins.assets)} part(s) "
            f"in {path} (trusted on first use: review them; --frozen refuses releases the lock does not pin)"
        )
    else:
        result.notes.append(
            f"recorded the digests of {pins.tag} in {path}: a rebuild under this tag is refused"
        )


def _parts(assets: tuple[Asset, ...]) -> list[tuple[str, str | None]]:
    return [(a.name, a.digest) for a in assets]


def _describe_older(layout: Layout, result: InstallResult) -> None:
    keep = {layout.current_tag(), layout.previous_tag(), result.tag}
    older = [
        {"tag": b["tag"], "bytes": layout.trees.tree_bytes(Path(b["path"]))}
        for b in layout.installed()
        if b["tag"] not in keep
    ]
    result.older_bundles = older
    result.older_bundles_bytes = sum(b["bytes"] for b in older)
    if older:
        result.notes.append(
            f"{len(older)} older bundle(s) hold {human(result.older_bundles_bytes)}; "
            "`rocmdoctor bundle prune` (or install --prune) removes them"
        )


def _os_failure(exc: OSError, layout: Layout) -> str:
    import errno

    if isinstance(exc, NoSpaceLeft):
        return (
            f"{exc}; the previous bundle is still active. Free space (or choose another --prefix) and rerun"
        )
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


@contextlib.contextmanager
def _download_dir_held(layout: Layout, plan: InstallPlan) -> Iterator[None]:
    """A --download-dir is shared by whoever names it (the default, inside the prefix, is covered by the
    prefix's lock): its own flock, so a second install says the directory is in use instead of losing
    its parts to the first one's renames."""
    if plan.download_dir is None:
        yield
        return
    marker = layout.trees.secure_dir(plan.download_dir) / ".rocmdoctor-install.lock"
    try:
        fd = layout.trees.try_lock(marker)
    except BlockingIOError:
        raise InstallError(
            f"the download directory {plan.download_dir} is in use by another rocmdoctor install; wait for "
            "it to finish, or give each install its own --download-dir. Nothing was activated; the "
            "previous bundle is still active"
        ) from None
    try:
        yield
    finally:
        layout.trees.unlock(fd)


def _staging(layout: Layout, plan: InstallPlan) -> Path:
    return (plan.download_dir or layout.downloads) / plan.tag


class _Fetches:
    """The parts' downloads (or local verifications), running beside the extraction."""

    def __init__(self, layout: Layout, plan: InstallPlan) -> None:
        self.dest = layout.trees.secure_dir(_staging(layout, plan))
        self.counted = 0
        self._count_lock = threading.Lock()
        self.downloader = Downloader(plan.download, self._on_bytes)
        self.on_download = plan.on_download
        self.parts = [PartFile(s.asset, self.dest / s.asset.name) for s in plan.sources]
        self.pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=min(4, len(self.parts)), thread_name_prefix="fetch"
        )
        self.futures = [
            self.pool.submit(self._one, part, source)
            for part, source in zip(self.parts, plan.sources, strict=True)
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
    trees = layout.trees
    fetches = _Fetches(layout, plan)
    try:
        trees.make_dirs(partial, exist_ok=False)
        try:
            extract_stream(PartStream(fetches.parts), partial, plan.on_extract, plan.extractor)
        except StreamRestarted:
            # A part started over after extraction had read it: extract again from the finished files.
            fetches.wait()
            trees.remove_tree(partial)
            trees.make_dirs(partial, exist_ok=False)
            extract_stream(PartStream(fetches.parts), partial, plan.on_extract, plan.extractor)
        except (DownloadError, StreamCancelled):
            fetches.wait()
            raise
        except (ArchiveError, UnsafeArchive) as exc:
            # A corrupt archive is usually a corrupt download: let the parts finish so the error
            # names the part whose digest is wrong rather than tar's symptom.
            fetches.wait()
            raise UnsafeBundle(
                f"{exc}. Nothing was activated; the previous bundle is still active. "
                "Report this bundle to its publisher"
            ) from None
        except OSError:
            # A part file that vanished or was refused under the reader is a symptom: the download's
            # own error (a digest mismatch, a planted link) came first and is the one reported.
            fetches.wait()
            raise
        fetches.wait()  # every digest verified before the tree can become visible
        root = _validate(trees, partial, plan)
        write_json_atomic(
            layout,
            root / METADATA,
            envelope(
                tag=plan.tag,
                family=plan.family,
                repo=plan.repo,
                installed_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                assets=[
                    {"name": s.asset.name, "size": s.asset.size, "digest": s.asset.digest}
                    for s in plan.sources
                ],
            ),
        )
        qualify_tree(
            trees, root, plan.tag, _assets(plan), plan.qualify, live=layout.current_tag() == plan.tag
        )
        trees.sync_dir(root)
        _move_into_place(layout, root, plan.tag)
        return fetches.counted
    except BaseException:
        fetches.cancel()
        trees.remove_tree(partial, ignore_errors=True)
        raise


def _qualify_staged(layout: Layout, plan: InstallPlan) -> None:
    """Qualify the bundle staged at bundles/<tag> against the host, before `current` may move to it."""
    qualify_installed(
        layout.trees, layout.bundles / plan.tag, plan.tag, layout.current_tag(), plan.qualify, _assets(plan)
    )


def _assets(plan: InstallPlan) -> list[tuple[str, str | None]]:
    return [(s.asset.name, s.asset.digest) for s in plan.sources]


def _bundle_root(trees: OwnedTrees, partial: Path) -> Path:
    """The tree itself, or its single top-level directory when the tarball wraps one."""
    if trees.is_dir(partial / "bin"):
        return partial
    entries = [partial / name for name in trees.list_dir(partial)]
    if (
        len(entries) == 1
        and trees.is_dir(entries[0])
        and not trees.is_link(entries[0])
        and trees.is_dir(entries[0] / "bin")
    ):
        return entries[0]
    return partial


def _validate(trees: OwnedTrees, partial: Path, plan: InstallPlan) -> Path:
    root = _bundle_root(trees, partial)
    missing = [name for name in ("bin/vllm-server", "bin/python3") if not trees.is_file(root / name)]
    if missing:
        raise InstallError(
            f"the extracted {plan.tag} lacks {', '.join(missing)}: not a vllm-rocm bundle. "
            "Nothing was activated; check the tag and the pins (`rocmdoctor bundle lock`)"
        )
    fix_exec_bits(trees, root)
    python = root / "bin" / "python3"
    commands = [[str(python), "-c", "pass"]]
    if plan.precompile:
        commands.append(
            [str(python), "-m", "compileall", "-q", "-j0", *map(str, trees.glob(root, "lib/python3.*"))]
        )
    for command in commands:
        done = run_program(command, VALIDATE_TIMEOUT_S)
        if done.returncode is None:
            why = done.spawn_error or f"it did not finish within {VALIDATE_TIMEOUT_S} s"
            raise InstallError(
                f"the bundle's interpreter does not run ({why}). Nothing was activated; "
                "the previous bundle is still active"
            )
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise InstallError(
                f"`{' '.join(command[1:3])}` in the new bundle failed (exit {done.returncode}: "
                f"{' / '.join(tail)}). Nothing was activated; the previous bundle is still active"
            )
    return root


def _move_into_place(layout: Layout, root: Path, tag: str) -> None:
    final, trees = layout.bundles / tag, layout.trees
    if trees.exists(final) and trees.exchange(root, final):
        # --force or a rebuilt release: `current` saw the old tree, then the new one, never nothing.
        trees.sync_dir(layout.bundles)
        trees.remove_tree(root)  # now the old tree
    else:
        aside = layout.bundles / f".{tag}.old-{os.getpid()}"
        if trees.exists(final):  # no RENAME_EXCHANGE here: keep the old tree until the new one is in
            trees.replace(final, aside)
        trees.replace(root, final)
        trees.sync_dir(layout.bundles)
        trees.remove_tree(aside, ignore_errors=True)
    partial = layout.bundles / f"{tag}.partial"
    if trees.exists(partial):
        trees.remove_tree(partial)


def _activate(layout: Layout, tag: str) -> None:
    old = layout.current_tag()
    if old and old != tag and layout.trees.is_dir(layout.bundles / old):
        _point(layout, layout.previous, f"bundles/{old}")
    _point(layout, layout.current, f"bundles/{tag}")


def bundle_name(layout: Layout, given: str, option: str = "--to") -> str:
    """A bundle named by the user: a tag, or a path whose parent is <prefix>/bundles; nothing else
    (a `current` pointing anywhere else would dangle or escape the prefix)."""
    name = given
    if "/" in given:
        path = Path(os.path.normpath(os.path.abspath(given)))
        if path.parent != Path(os.path.normpath(os.path.abspath(layout.bundles))):
            raise InvalidRequest(
                f"{option} {given}: not a bundle under {layout.bundles}; pass a tag that "
                "`rocmdoctor bundles` lists"
            )
        name = path.name
    try:
        check_tag(name, name.rsplit("-", 1)[-1], option)
    except ManifestError:
        raise InvalidRequest(
            f"{option} {given!r} is not a bundle tag (vllm<ver>-rocm<ver>-<family>); "
            "`rocmdoctor bundles` lists what is installed"
        ) from None
    return name


def rollback(prefix: Path, writer: HostWriter, to: str | None = None, force: bool = False) -> InstallResult:
    """Point `current` back (at `previous`, or at the installed bundle `to`) through `writer`."""
    layout = Layout(prefix, writer.trees)
    check = writer.check_mode
    if not layout.trees.is_dir(layout.prefix):
        raise InvalidRequest(f"{prefix} does not exist: nothing is installed there (check --prefix)")
    if to is not None:
        to = bundle_name(layout, to)
    held = None if check else _lock(layout, create=False)
    try:
        if not check:
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
        refusal = None if force else rollback_refusal(layout.bundles / target, target)
        if refusal:
            raise InstallError(refusal)
        if not writer.change("activate", f"{layout.current} -> bundles/{target}"):
            return InstallResult(
                True,
                f"{writer.past('switched', 'switch')} from {current} to {target}",
                target,
                current,
                layout.previous_tag(),
                family,
                str(layout.bundles / target),
                check=True,
                diff=state_diff({"current": current}, {"current": target}),
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
            diff=state_diff({"current": current}, {"current": target}),
        )
    finally:
        if held is not None:
            _unlock(layout, held)


def fetch_to(
    sources: list[Source],
    dest: Path,
    options: DownloadOptions,
    on_bytes: ProgressFn | None = None,
    writer: HostWriter | None = None,
) -> Iterator[tuple[Asset, bool]]:
    """Fill a mirror directory through `writer` (this machine's, by default): yields (asset,
    downloaded?) per part; parts already there are verified, and a part of an earlier build of the same
    tag is replaced."""
    trees = (writer or HostWriter("/")).trees
    dest = trees.secure_dir(dest)
    downloader = Downloader(options, on_bytes)
    for source in sources:
        part = PartFile(source.asset, dest / source.asset.name)
        final = dest / source.asset.name
        if source.local is not None:
            verify_local(part, source.local, on_bytes)
            new = not trees.lexists(final) or not trees.same_file(source.local, final)
            if new:
                _copy_owned(trees, source.local, final, source.asset.name)
        else:
            new = downloader.fetch(part, source.url or "", dest)
        trees.remove(dest / f"{source.asset.name}.etag")
        yield source.asset, new


def _copy_owned(trees: OwnedTrees, source: Path, final: Path, name: str) -> None:
    staging = final.with_name(final.name + ".partial")
    trees.remove(staging)
    try:
        out = trees.open_new(staging)
    except ForeignFile as exc:
        raise DownloadError(name, str(exc)) from None
    with trees.open_plain(source) as src, out:
        while block := src.read(1 << 20):
            view = memoryview(block)
            while view:  # an unbuffered write may take part of the block
                view = view[out.write(view) or 0 :]
    trees.replace(staging, final)


@dataclass
class PruneResult:
    changed: bool
    msg: str
    prefix: str
    check: bool
    keep: int
    kept: list[str]
    removed: list[dict[str, Any]]  # {"tag", "bytes"}
    freed_bytes: int
    refused: list[dict[str, Any]]  # {"tag", "users"}: in use by a running process
    diff: dict[str, Any] = field(default_factory=lambda: state_diff({}, {}))

    @property
    def failed(self) -> bool:
        return bool(self.refused)

    def change(self) -> Change:
        fields = {**asdict(self), "failed": self.failed}
        return Change(fields.pop("changed"), fields.pop("msg"), fields.pop("diff"), fields)

    def to_json(self) -> dict[str, Any]:
        return self.change().envelope()


def _keep_list(layout: Layout, keep: int) -> list[str]:
    """current, then previous, then the newest others, until `keep` bundles are kept."""
    installed = layout.installed()
    order = [layout.current_tag(), layout.previous_tag()]
    newest = sorted(installed, key=lambda b: (b["installed_at"] or "", b["tag"]), reverse=True)
    order += [b["tag"] for b in newest]
    kept: list[str] = []
    present = {b["tag"] for b in installed}
    for tag in order:
        if tag and tag in present and tag not in kept and (len(kept) < keep or tag == layout.current_tag()):
            kept.append(tag)
    last_qualified = newest_qualified(installed)  # never prune the last bundle known to work here
    if last_qualified and newest_qualified([b for b in installed if b["tag"] in kept]) is None:
        kept.append(last_qualified)
    return kept


def bundles_in_use(layout: Layout, tags: list[str], host: Any) -> dict[str, list[str]]:
    """Which of `tags` a running process uses: its executable, working directory, command line or a
    mapped file lies in the bundle (through bundles/<tag>, its real path, or current/previous)."""
    roots: dict[str, set[str]] = {}
    for tag in tags:
        path = layout.bundles / tag
        roots[tag] = {str(path), layout.trees.real_path(path)}
    for link in (layout.current, layout.previous):
        target = layout._target_tag(link)
        if target in roots:
            roots[target].add(str(link))
    users: dict[str, list[str]] = {}
    me = os.getpid()
    for pid in host.pids():
        if pid == me:
            continue
        texts: list[str] = []
        for name in ("exe", "cwd"):
            read = host.readlink(f"/proc/{pid}/{name}")
            if read.ok:
                texts.append(str(read.value).removesuffix(" (deleted)"))
        cmdline = host.read_text(f"/proc/{pid}/cmdline", limit=1 << 16)
        if cmdline.ok:
            texts += str(cmdline.value).split("\0")
        maps = host.read_text(f"/proc/{pid}/maps", limit=16 << 20)
        if maps.ok:
            texts += [
                f[5] for f in (line.split(None, 5) for line in str(maps.value).splitlines()) if len(f) == 6
            ]
        for tag, names in roots.items():
            if any(t == n or (n + "/") in t for t in texts for n in names):
                comm = host.read_text(f"/proc/{pid}/comm", limit=256)
                users.setdefault(tag, []).append(f"pid {pid} ({str(comm.value).strip() if comm.ok else '?'})")
    return users


def prune(prefix: Path, keep: int, host: Any, writer: HostWriter) -> PruneResult:
    """Remove bundles other than current, previous and the newest up to `keep`; never one that a
    running process uses. In the writer's check mode: report what would go, remove nothing."""
    layout = Layout(prefix, writer.trees)
    check = writer.check_mode
    if keep < 1:
        raise InvalidRequest(f"--keep {keep}: keep at least 1 (the current bundle)")
    if not layout.trees.is_dir(layout.prefix):
        raise InvalidRequest(f"{prefix} does not exist: nothing is installed there (check --prefix)")
    held = None if check else _lock(layout, create=False)
    try:
        if not check:
            recover(layout)
        kept = _keep_list(layout, keep)
        doomed = [b["tag"] for b in layout.installed() if b["tag"] not in kept]
        in_use = bundles_in_use(layout, doomed, host) if doomed else {}
        removed, refused = [], []
        for tag in doomed:
            if tag in in_use:
                refused.append({"tag": tag, "users": in_use[tag]})
                continue
            size = layout.trees.tree_bytes(layout.bundles / tag)
            if writer.change("remove", str(layout.bundles / tag)):
                _remove_bundle(layout, tag)
            removed.append({"tag": tag, "bytes": size})
        if layout.previous_tag() in [r["tag"] for r in removed] and writer.change(
            "remove", str(layout.previous)
        ):
            layout.trees.remove(layout.previous, missing_ok=False)
        freed = sum(r["bytes"] for r in removed)
        msg = (
            f"{writer.past('removed', 'remove')} {len(removed)} bundle(s), "
            f"{writer.past('freed', 'free')} {human(freed)}; "
            f"kept {', '.join(kept) or 'nothing'}"
        )
        if refused:
            msg += "; refused " + "; ".join(
                f"{r['tag']} (in use by {', '.join(r['users'])})" for r in refused
            )
            msg += ": stop what runs from it (or roll back to it) and rerun"
        return PruneResult(
            changed=bool(removed),
            msg=msg,
            prefix=str(prefix),
            check=check,
            keep=keep,
            kept=kept,
            removed=removed,
            freed_bytes=freed,
            refused=refused,
            diff=state_diff({"bundles": kept + doomed}, {"bundles": kept + [r["tag"] for r in refused]}),
        )
    finally:
        if held is not None:
            _unlock(layout, held)


def _remove_bundle(layout: Layout, tag: str) -> None:
    """Out of sight in one rename (a killed run leaves `.<tag>.prune-<pid>`, which recover removes),
    then deleted, with its staged downloads."""
    aside, trees = layout.bundles / f".{tag}.prune-{os.getpid()}", layout.trees
    trees.replace(layout.bundles / tag, aside)
    trees.sync_dir(layout.bundles)
    trees.remove_tree(aside)
    trees.remove_tree(layout.downloads / tag, ignore_errors=True)
