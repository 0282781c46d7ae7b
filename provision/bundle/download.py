"""Fetch bundle parts into a staging directory: resumable, bounded, hashed on the way.

Each part downloads into `<dest>/<name>.partial` and becomes `<dest>/<name>` only once its sha256
matches. A retry first re-hashes what is on disk, then asks for the rest with `Range` + `If-Range`
(the ETag of the first answer); a `200` restarts the part, a `206` must start where we are.
Connect and read timeouts are always set, retries are bounded with exponential backoff, and a
minimum-throughput rule over a window ends a connection that trickles (a slow mirror still works).

Download directories may be shared (`--download-dir /tmp`): a directory someone else can write is
refused unless it is sticky, every file is opened with O_NOFOLLOW (new ones with O_EXCL) and must be
a regular file owned by us; a link there is never followed.

A `PartFile` publishes how many bytes are safely in the file, so extraction can follow the download
(see `PartStream`) instead of waiting for it.
"""

from __future__ import annotations

import errno
import hashlib
import io
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests
import urllib3

from rocmdoctor import host_files as files
from rocmdoctor.host_files import (
    UnsafeDirectory as UnsafeDirectory,  # the bundle command catches it from here
)
from rocmdoctor.host_files import lexists as lexists
from rocmdoctor.host_files import secure_dir as secure_dir
from rocmdoctor.provision import bounded_http
from rocmdoctor.provision.bundle.manifest import Asset

ProgressFn = Callable[[int], None]
CHUNK = 1 << 20


@dataclass(frozen=True)
class DownloadOptions:
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    retries: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    min_rate_bps: float = 16 * 1024  # below this over `rate_window_s`, the connection is dropped
    rate_window_s: float = 30.0


class DownloadError(RuntimeError):
    def __init__(self, part: str, message: str) -> None:
        super().__init__(f"{part}: {message}")
        self.part = part


class DigestMismatch(DownloadError):
    pass


class StreamRestarted(RuntimeError):
    """A part was restarted from byte 0 after a reader had consumed some of it."""


class StreamCancelled(RuntimeError):
    """The consumer gave up (its own error says why)."""


class DownloadCancelled(Exception):
    """The install gave up on this part because something else failed first."""


class _Retryable(Exception):
    pass


def open_owned(path: Path, how: str = files.READ, name: str = "") -> io.FileIO:
    """A file in a download directory (see host_files.open_owned); a planted one is a DownloadError."""
    try:
        return files.open_owned(path, how)
    except files.ForeignFile as exc:
        raise DownloadError(name or path.name, str(exc)) from None


def sha256_file(
    path: Path,
    digest: hashlib._Hash | None = None,
    on_bytes: ProgressFn | None = None,
    owned: bool = True,
) -> hashlib._Hash:
    """`owned`: the file sits in a download directory (no link followed, ours only); a mirror's
    files are the user's own input and may be links."""
    digest = digest or hashlib.sha256()
    with open_owned(path) if owned else files.open_plain(path) as fh:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            digest.update(view[:n])
            if on_bytes:
                on_bytes(n)
    return digest


@dataclass
class PartFile:
    """One part on its way to disk, observable by a reader in another thread."""

    asset: Asset
    path: Path  # where the bytes are now (the .partial file while downloading)
    written: int = 0
    done: bool = False
    error: BaseException | None = None
    generation: int = 0  # bumped when the file restarts from 0
    owned: bool = True  # in a download directory (see open_owned); False for a mirror's file
    cond: threading.Condition = field(default_factory=threading.Condition)

    def publish(
        self,
        written: int | None = None,
        path: Path | None = None,
        done: bool = False,
        error: BaseException | None = None,
        restarted: bool = False,
    ) -> None:
        with self.cond:
            if written is not None:
                self.written = written
            if path is not None:
                self.path = path
            if restarted:
                self.generation += 1
            self.done = self.done or done
            self.error = error or self.error
            self.cond.notify_all()


def _check_digest(part: PartFile, digest: hashlib._Hash) -> None:
    if digest.hexdigest() != part.asset.hexdigest:
        raise DigestMismatch(
            part.asset.name,
            f"sha256 mismatch: expected {part.asset.hexdigest}, got {digest.hexdigest()}. The download was "
            "corrupted or the release was rebuilt under the same tag: rerun to download it again; if it "
            "fails the same way, run `rocmdoctor bundle lock` to pin the new build",
        )


def verify_local(part: PartFile, source: Path, on_bytes: ProgressFn | None = None) -> None:
    """A part in a mirror directory: hash it in place."""
    part.owned = False
    part.publish(path=source)
    try:
        size = files.size(source)
        if size != part.asset.size:
            raise DownloadError(
                part.asset.name,
                f"{source} is {size} bytes, the lock says {part.asset.size}; "
                "refill the mirror with `rocmdoctor bundle fetch --to DIR`",
            )
        _check_digest(part, _hash_published(part, source, on_bytes, owned=False))
        part.publish(done=True)
    except BaseException as exc:
        part.publish(error=exc)
        raise


def _hash_published(part: PartFile, path: Path, on_bytes: ProgressFn | None, owned: bool) -> hashlib._Hash:
    seen = 0

    def advance(n: int) -> None:
        nonlocal seen
        seen += n
        part.publish(written=seen)
        if on_bytes:
            on_bytes(n)

    return sha256_file(path, on_bytes=advance, owned=owned)


def _finished_matches(part: PartFile, final: Path, on_bytes: ProgressFn | None) -> bool:
    """A finished part from an earlier run. One of an earlier build of the same tag (another size
    or digest) is deleted, so the caller fetches it again, instead of blocking every rerun."""
    part.publish(path=final)
    with open_owned(final, files.READ, part.asset.name) as fh:  # a planted link or foreign file: refused
        size = files.open_size(fh)
    if size == part.asset.size and (
        _hash_published(part, final, on_bytes, owned=True).hexdigest() == part.asset.hexdigest
    ):
        return True
    with part.cond:
        files.remove(final, missing_ok=False)
        part.path = final.with_name(final.name + ".partial")
        part.written = 0
        part.generation += 1
        part.cond.notify_all()
    return False


class Downloader:
    def __init__(self, options: DownloadOptions, on_bytes: ProgressFn | None = None) -> None:
        self.options = options
        self.on_bytes = on_bytes or (lambda n: None)
        self._local = threading.local()
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()

    def _session(self) -> requests.Session:
        if not hasattr(self._local, "session"):
            self._local.session = bounded_http.new_session()
        return self._local.session

    def fetch(self, part: PartFile, url: str, dest_dir: Path) -> bool:
        """Download `part` from `url` into `dest_dir/<name>`; raises DownloadError, publishes progress.
        False when a finished file from an earlier run was already right."""
        final = dest_dir / part.asset.name
        try:
            if lexists(final) and _finished_matches(part, final, self.on_bytes):
                part.publish(done=True)
                return False
            self._fetch(part, url, final)
            part.publish(done=True)
            return True
        except OSError as exc:
            error = DownloadError(part.asset.name, _os_message(exc, dest_dir))
            part.publish(error=error)
            raise error from None
        except BaseException as exc:
            part.publish(error=exc)
            raise

    def _fetch(self, part: PartFile, url: str, final: Path) -> None:
        opts = self.options
        staging = final.with_name(final.name + ".partial")
        etag_file = final.with_name(final.name + ".etag")
        part.publish(path=staging)
        attempt = 0
        while True:
            try:
                digest = self._attempt(part, url, staging, etag_file)
                break
            except _Retryable as exc:
                attempt += 1
                if attempt > opts.retries:
                    have = files.size(staging, follow_links=False)
                    raise DownloadError(
                        part.asset.name,
                        f"gave up after {attempt} attempts: {exc}. {have} bytes "
                        "are kept: rerun the same command to resume",
                    ) from None
                if self._cancelled.wait(min(opts.max_backoff_s, opts.backoff_s * 2 ** (attempt - 1))):
                    raise DownloadCancelled(part.asset.name) from None
        try:
            _check_digest(part, digest)
        except DigestMismatch as exc:
            # Published before the file goes: a reader that opens the part now sees this error,
            # never "No such file" (the first error is the one reported).
            part.publish(error=exc)
            files.remove(staging)
            files.remove(etag_file)
            raise
        with part.cond:
            files.replace(staging, final)
            part.path = final
        files.remove(etag_file)

    def _attempt(self, part: PartFile, url: str, staging: Path, etag_file: Path) -> hashlib._Hash:
        """One request; returns the digest of the complete file or raises _Retryable."""
        asset, opts = part.asset, self.options
        have = files.size(staging, follow_links=False)
        if have > asset.size:
            files.remove(staging, missing_ok=False)
            have = 0
            part.publish(written=0, restarted=True)
        # Only bytes that reached the file count, and they are hashed again: the file may be from a
        # killed run, and a cut connection drops whatever was in flight.
        digest = sha256_file(staging) if have else hashlib.sha256()
        part.publish(written=have)
        etag = _read_etag(etag_file, asset.name) if have else None
        headers = {"Accept": "application/octet-stream"}
        if have:
            headers["Range"] = f"bytes={have}-"
            if etag:
                headers["If-Range"] = etag
        try:
            # Status line and headers within connect + read timeout in total (a drip cannot hold us);
            # the body then has its own rule: a stall timeout per read and the minimum throughput.
            response = bounded_http.open_stream(
                url,
                deadline=bounded_http.Deadline(opts.connect_timeout_s + opts.read_timeout_s),
                headers=headers,
                session=self._session(),
                connect_s=opts.connect_timeout_s,
                read_s=opts.read_timeout_s,
            )
        except bounded_http.HttpTimeout:
            raise _Retryable(
                f"{url} did not send its response headers within "
                f"{opts.connect_timeout_s + opts.read_timeout_s:g}s"
            ) from None
        except requests.Timeout:
            raise _Retryable(
                f"no answer from {url} within {opts.connect_timeout_s:g}s/{opts.read_timeout_s:g}s"
            ) from None
        except requests.ConnectionError as exc:
            raise _Retryable(f"cannot connect to {url}: {_short(exc)}") from None
        with response:
            status = response.status_code
            if status == 416 and have:
                if have == asset.size:
                    return digest
                raise DownloadError(
                    asset.name,
                    f"the server has only {have} bytes, the lock says {asset.size}: "
                    "the part is shorter than declared (truncated upload or a rebuilt release; "
                    "run `rocmdoctor bundle lock` or fix the mirror)",
                )
            if status in (404, 410):
                raise DownloadError(
                    asset.name,
                    f"not found at {url} ({status}): the mirror lacks it or the "
                    "release was removed; fill the mirror with `rocmdoctor bundle fetch` or "
                    "refresh the pins with `rocmdoctor bundle lock`",
                )
            if status >= 500 or status in (408, 429):
                raise _Retryable(f"server error {status} from {url}")
            if status == 206 and have:
                if not response.headers.get("Content-Range", "").startswith(f"bytes {have}-"):
                    raise _Retryable(
                        f"the server resumed at the wrong offset ({response.headers.get('Content-Range')})"
                    )
                mode = "ab"
            elif status == 200:
                if have:
                    part.publish(written=0, restarted=True)
                have, digest, mode = 0, hashlib.sha256(), "wb"
            else:
                raise DownloadError(asset.name, f"unexpected HTTP {status} from {url}")
            if response.headers.get("ETag"):
                _write_etag(etag_file, response.headers["ETag"], asset.name)
            if mode == "wb":
                files.remove(staging)
                how = files.CREATE
            else:
                how = files.APPEND
            rate = _Throughput(url, opts)
            with open_owned(staging, how, asset.name) as fh:
                while block := self._read_block(response, have, url):
                    if self._cancelled.is_set():
                        raise DownloadCancelled(asset.name)
                    rate.add(len(block))
                    if have + len(block) > asset.size:
                        raise DownloadError(
                            asset.name,
                            f"the server sent more than the {asset.size} bytes the "
                            "lock declares; run `rocmdoctor bundle lock` to refresh the pins",
                        )
                    fh.write(block)
                    digest.update(block)
                    have += len(block)
                    part.publish(written=have)
                    self.on_bytes(len(block))
        if have != asset.size:
            raise _Retryable(f"the server ended the body at {have} of {asset.size} bytes")
        return digest

    def _read_block(self, response: requests.Response, have: int, url: str = "") -> bytes:
        """Whatever has arrived, up to CHUNK (read1): a cut connection loses only bytes in flight, so a
        resume starts close to where the cut happened."""
        try:
            return response.raw.read1(CHUNK)
        except (urllib3.exceptions.ReadTimeoutError, TimeoutError):
            raise _Retryable(
                f"{url or 'the server'} stalled: no data for {self.options.read_timeout_s:g}s at byte {have}"
            ) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _Retryable(f"connection lost at byte {have}: {_short(exc)}") from None


class _Throughput:
    """The minimum-throughput rule: every `rate_window_s`, the bytes of that window must reach
    `min_rate_bps` on average, or the connection is dropped (and retried) naming URL and rate."""

    def __init__(self, url: str, options: DownloadOptions) -> None:
        self.url, self.options = url, options
        self.window_start = time.monotonic()
        self.window_bytes = 0

    def add(self, n: int) -> None:
        self.window_bytes += n
        elapsed = time.monotonic() - self.window_start
        if elapsed < self.options.rate_window_s:
            return
        rate = self.window_bytes / elapsed
        if rate < self.options.min_rate_bps:
            raise _Retryable(
                f"{self.url} delivered {self.window_bytes} bytes in {elapsed:.1f}s ({rate:.0f} B/s), "
                f"below the minimum {self.options.min_rate_bps:.0f} B/s (a stalled or trickling server; "
                "--min-rate lowers the bar for a slow mirror)"
            )
        self.window_start, self.window_bytes = time.monotonic(), 0


ETAG_LIMIT = 1024


def _read_etag(path: Path, name: str) -> str | None:
    if not lexists(path):
        return None
    with open_owned(path, files.READ, name) as fh:
        return fh.read(ETAG_LIMIT).decode("ascii", errors="replace").strip() or None


def _write_etag(path: Path, etag: str, name: str) -> None:
    files.remove(path)
    with open_owned(path, files.CREATE, name) as fh:
        fh.write(etag[:ETAG_LIMIT].encode("ascii", errors="replace"))


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) < 200 else text[:200] + "..."


def _os_message(exc: OSError, where: Path) -> str:
    if exc.errno == errno.ENOSPC:
        return f"no space left on the device holding {where}; free space there or pick another --prefix"
    return f"cannot write under {where}: {exc.strerror or exc}"


class PartStream(io.RawIOBase):
    """The parts, in order, as one byte stream that follows the downloads as they grow.

    Raises the part's download error as soon as the reader needs bytes it will never get, and
    StreamRestarted if a part it already read from went back to byte 0."""

    def __init__(self, parts: list[PartFile], poll_s: float = 0.5) -> None:
        self.parts = parts
        self.poll_s = poll_s
        self._index = 0
        self._pos = 0
        self._fh: io.FileIO | None = None
        self._generation = 0
        self._cancelled = False

    def cancel(self) -> None:
        self._cancelled = True
        for part in self.parts:
            with part.cond:
                part.cond.notify_all()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._index < len(self.parts):
            part = self.parts[self._index]
            with part.cond:
                while True:
                    if self._cancelled:
                        raise StreamCancelled(part.asset.name)
                    if part.generation != self._generation:
                        if self._pos:
                            raise StreamRestarted(part.asset.name)
                        if self._fh is not None:  # nothing read yet: follow the new file
                            self._fh.close()
                            self._fh = None
                        self._generation = part.generation
                    if part.error is not None:
                        raise part.error
                    if self._pos < part.written or part.done:
                        break
                    part.cond.wait(self.poll_s)
                if self._fh is None:
                    self._fh = (  # kept open across reads
                        open_owned(part.path, files.READ, part.asset.name)
                        if part.owned
                        else files.open_plain(part.path)
                    )
                available = part.written - self._pos
            if available <= 0:  # the part is done and fully read
                self._fh.close()
                self._fh = None
                self._index += 1
                self._pos = 0
                self._generation = 0
                continue
            n = self._fh.readinto(memoryview(buffer)[: min(len(buffer), available)])
            if not n:
                raise StreamRestarted(part.asset.name)
            self._pos += n
            return n
        return 0

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        super().close()
