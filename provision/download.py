"""Fetch bundle parts into a staging directory: resumable, bounded, hashed on the way.

Each part downloads into `<dest>/<name>.partial` and becomes `<dest>/<name>` only once its sha256
matches. A retry first re-hashes what is on disk, then asks for the rest with `Range` + `If-Range`
(the ETag of the first answer); a `200` restarts the part, a `206` must start where we are.
Connect and read timeouts are always set, retries are bounded with exponential backoff.

A `PartFile` publishes how many bytes are safely in the file, so extraction can follow the download
(see `PartStream`) instead of waiting for it.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests
import urllib3

from .manifest import Asset

ProgressFn = Callable[[int], None]
CHUNK = 1 << 20


@dataclass(frozen=True)
class DownloadOptions:
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    retries: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0


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


def sha256_file(
    path: Path, digest: hashlib._Hash | None = None, on_bytes: ProgressFn | None = None
) -> hashlib._Hash:
    digest = digest or hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
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
    """A part already on disk (a mirror directory, an earlier download): hash it in place."""
    part.publish(path=source)
    try:
        size = source.stat().st_size
        if size != part.asset.size:
            raise DownloadError(
                part.asset.name,
                f"{source} is {size} bytes, the lock says {part.asset.size}; "
                "refill the mirror with `rocmdoctor bundle fetch --to DIR`",
            )
        seen = 0

        def advance(n: int) -> None:
            nonlocal seen
            seen += n
            part.publish(written=seen)
            if on_bytes:
                on_bytes(n)

        _check_digest(part, sha256_file(source, on_bytes=advance))
        part.publish(done=True)
    except BaseException as exc:
        part.publish(error=exc)
        raise


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
            self._local.session = requests.Session()
        return self._local.session

    def fetch(self, part: PartFile, url: str, dest_dir: Path) -> None:
        """Download `part` from `url` into `dest_dir/<name>`; raises DownloadError, publishes progress."""
        final = dest_dir / part.asset.name
        try:
            if final.exists():
                verify_local(part, final, self.on_bytes)
                return
            self._fetch(part, url, final)
            part.publish(done=True)
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
                    have = staging.stat().st_size if staging.exists() else 0
                    raise DownloadError(
                        part.asset.name,
                        f"gave up after {attempt} attempts: {exc}. {have} bytes "
                        "are kept: rerun the same command to resume",
                    ) from None
                if self._cancelled.wait(min(opts.max_backoff_s, opts.backoff_s * 2 ** (attempt - 1))):
                    raise DownloadCancelled(part.asset.name) from None
        try:
            _check_digest(part, digest)
        except DigestMismatch:
            staging.unlink(missing_ok=True)
            etag_file.unlink(missing_ok=True)
            raise
        with part.cond:
            os.replace(staging, final)
            part.path = final
        etag_file.unlink(missing_ok=True)

    def _attempt(self, part: PartFile, url: str, staging: Path, etag_file: Path) -> hashlib._Hash:
        """One request; returns the digest of the complete file or raises _Retryable."""
        asset, opts = part.asset, self.options
        have = staging.stat().st_size if staging.exists() else 0
        if have > asset.size:
            staging.unlink()
            have = 0
            part.publish(written=0, restarted=True)
        # Only bytes that reached the file count, and they are hashed again: the file may be from a
        # killed run, and a cut connection drops whatever was in flight.
        digest = sha256_file(staging) if have else hashlib.sha256()
        part.publish(written=have)
        etag = etag_file.read_text().strip() if have and etag_file.exists() else None
        headers = {"Accept": "application/octet-stream"}
        if have:
            headers["Range"] = f"bytes={have}-"
            if etag:
                headers["If-Range"] = etag
        try:
            response = self._session().get(
                url, headers=headers, stream=True, timeout=(opts.connect_timeout_s, opts.read_timeout_s)
            )
        except requests.Timeout:
            raise _Retryable(
                f"no answer from {url} within {opts.connect_timeout_s:g}s/{opts.read_timeout_s:g}s"
            )
        except requests.ConnectionError as exc:
            raise _Retryable(f"cannot connect to {url}: {_short(exc)}")
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
                etag_file.write_text(response.headers["ETag"])
            with open(staging, mode, buffering=0) as fh:
                while block := self._read_block(response, have):
                    if self._cancelled.is_set():
                        raise DownloadCancelled(asset.name)
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

    def _read_block(self, response: requests.Response, have: int) -> bytes:
        """Whatever has arrived, up to CHUNK (read1): a cut connection loses only bytes in flight, so a
        resume starts close to where the cut happened."""
        try:
            return response.raw.read1(CHUNK)
        except (urllib3.exceptions.ReadTimeoutError, TimeoutError):
            raise _Retryable(
                f"the server stalled: no data for {self.options.read_timeout_s:g}s at byte {have}"
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _Retryable(f"connection lost at byte {have}: {_short(exc)}")


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

    def readinto(self, buffer) -> int:  # type: ignore[override]
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
                    self._fh = open(part.path, "rb", buffering=0)  # noqa: SIM115 - kept open across reads
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
