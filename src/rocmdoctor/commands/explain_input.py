"""The logs `explain` reads, each within fixed memory and time.

- A regular file: its first HEAD_BYTES and its last TAIL_BYTES are scanned, the middle is skipped
  (line numbers after a gap are unknown; the byte offset is given instead). A 2 GB log costs the same
  as a 16 MiB one: a failed start's cause is near the start (the environment, the first error) or at
  the end (the traceback), and a long-running server's middle is request logs.
- A pipe (`-` for stdin, `<(...)`): at most STREAM_BYTES, for at most STREAM_SECONDS; an endless
  stream is cut there and the report says so.
- A systemd unit's journal since its last start (`journalctl --unit U --since` systemd's first
  message of the unit's current invocation), at most JOURNAL_LINES lines, through the Host's process
  seam (so only on the live root).
Anything else (a directory, /dev/zero, a socket) is bad input: exit 2 with what to give instead.
"""

from __future__ import annotations

import io
import os
import re
import select
import stat
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from rocmdoctor.vllm.log_scan import Scan, Scanner

if TYPE_CHECKING:
    from rocmdoctor.host import Host

HEAD_BYTES = 8 * 1024 * 1024
TAIL_BYTES = 8 * 1024 * 1024
STREAM_BYTES = 16 * 1024 * 1024
STREAM_SECONDS = 60.0
JOURNAL_LINES = 20000
JOURNAL_TIMEOUT_S = 30.0
CHUNK = 1024 * 1024

# Lemonade's Linux service runs lemond under systemd with its output in the journal
# (lemonade-sdk/lemonade data/lemond.service.in: no StandardOutput= of its own, so journald; releases
# before lemond ran `lemonade-server serve` as data/lemonade-server.service.in, the same way);
# rocmdoctor's own Lemonade client points users there too (provision/server/lemonade_api.py).
LEMONADE_UNITS = ("lemond.service", "lemonade-server.service")

# systemd's unit name characters (systemd.unit(5): "ASCII letters, digits, ':', '-', '_', '.', '\\'",
# '@' for instances); a name starting with '-' would be an option to systemctl.
_UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.\\@][A-Za-z0-9:_.\\@-]{0,250}$")


class InputError(ValueError):
    """A log that cannot be read as asked: the message says what to give instead."""


@dataclass
class SourceScan:
    name: str
    kind: str  # file | stream | journal
    scan: Scan
    cut: str = ""  # why the reading stopped early, for the report


def unit_name(text: str) -> str:
    if not _UNIT_NAME.match(text):
        raise InputError(
            f"--unit {text[:80]!r}: not a systemd unit name (letters, digits, ':', '_', '.', '@', '-')"
        )
    return text if "." in text else f"{text}.service"


def read_path(name: str) -> SourceScan:
    """A file or a pipe named on the command line; `-` is stdin."""
    if name == "-":
        stdin = sys.stdin.buffer
        try:
            fd = stdin.fileno()
        except (AttributeError, OSError, io.UnsupportedOperation):
            return _read_buffer(stdin)  # an in-memory stdin (click's test runner): no fd to wait on
        return _read_stream("-", fd, close=False)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"{name}: {exc.strerror or exc}; give a log file, or - for stdin") from None
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode):
        os.set_blocking(fd, True)
        try:
            return _read_file(name, fd, st.st_size)
        finally:
            os.close(fd)
    if stat.S_ISFIFO(st.st_mode):
        return _read_stream(name, fd, close=True)
    os.close(fd)
    kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a device or socket"
    raise InputError(f"{name}: {kind}, not a log; give a log file, or - for stdin")


def _read_file(name: str, fd: int, size: int) -> SourceScan:
    scanner = Scanner()
    if size <= HEAD_BYTES + TAIL_BYTES:
        _pump(scanner, fd, size)
        return SourceScan(name, "file", scanner.finish())
    _pump(scanner, fd, HEAD_BYTES)
    tail_start = size - TAIL_BYTES
    scanner.skip(tail_start - HEAD_BYTES)
    os.lseek(fd, tail_start, os.SEEK_SET)
    _pump(scanner, fd, TAIL_BYTES)
    cut = f"read the first and the last {TAIL_BYTES // 2**20} MiB of {size} bytes"
    return SourceScan(name, "file", scanner.finish(), cut)


def _pump(scanner: Scanner, fd: int, limit: int) -> None:
    left = limit
    while left > 0:
        data = os.read(fd, min(CHUNK, left))
        if not data:
            return
        scanner.feed(data)
        left -= len(data)


def _read_stream(name: str, fd: int, close: bool) -> SourceScan:
    scanner = Scanner()
    deadline = time.monotonic() + STREAM_SECONDS
    cut = ""
    try:
        while True:
            if scanner.scan.bytes_read >= STREAM_BYTES:
                cut = f"stopped after {STREAM_BYTES // 2**20} MiB (the stream went on)"
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                cut = f"stopped after {STREAM_SECONDS:.0f} s (the stream was still open)"
                break
            ready, _, _ = select.select([fd], [], [], min(remaining, 1.0))
            if not ready:
                continue
            try:
                data = os.read(fd, min(CHUNK, STREAM_BYTES - scanner.scan.bytes_read))
            except BlockingIOError:
                continue
            if not data:
                break
            scanner.feed(data)
    finally:
        if close:
            os.close(fd)
    return SourceScan("stdin" if name == "-" else name, "stream", scanner.finish(), cut)


def _read_buffer(stream: BinaryIO) -> SourceScan:
    scanner = Scanner()
    while scanner.scan.bytes_read < STREAM_BYTES:
        data = stream.read(min(CHUNK, STREAM_BYTES - scanner.scan.bytes_read))
        if not data:
            return SourceScan("stdin", "stream", scanner.finish())
        scanner.feed(data)
    return SourceScan("stdin", "stream", scanner.finish(), f"stopped after {STREAM_BYTES // 2**20} MiB")


def lemonade_unit(host: Host) -> str:
    """The Lemonade unit this machine has: lemond.service, else the older lemonade-server.service."""
    for unit in LEMONADE_UNITS:
        shown = host.run(["systemctl", "show", "--property=LoadState", "--value", unit], timeout=10)
        if shown.stdout.strip() == "loaded":
            return unit
    return LEMONADE_UNITS[0]


def _journal(host: Host, unit: str, *argv: str, max_output: int = HEAD_BYTES) -> str:
    ran = host.run(
        ["journalctl", "--no-pager", "--quiet", *argv], timeout=JOURNAL_TIMEOUT_S, max_output=max_output
    )
    if ran.spawn_error or ran.timed_out or ran.returncode != 0:
        why = ran.spawn_error or ("timed out" if ran.timed_out else ran.stderr.strip()[:200])
        raise InputError(
            f"--unit {unit}: journalctl failed ({why}); run as root or in the systemd-journal group"
        )
    return ran.stdout


def _last_start(host: Host, unit: str) -> tuple[str, str]:
    """The unit's current invocation id and, as `@seconds.micros`, when systemd began it: the time of
    systemd's own first message tagged with that invocation ("Starting ..."), empty where there is none."""
    shown = host.run(["systemctl", "show", "--property=InvocationID", "--value", unit], timeout=10)
    if shown.spawn_error or shown.timed_out:
        raise InputError(f"--unit {unit}: cannot ask systemctl ({shown.spawn_error or 'timed out'})")
    invocation = shown.stdout.strip()
    if not invocation:
        return "", ""
    told = _journal(
        host, unit, "--output=short-unix", f"INVOCATION_ID={invocation}", "_PID=1", max_output=4096
    )
    first = told.split(maxsplit=1)
    return invocation, (f"@{first[0]}" if first and first[0].replace(".", "", 1).isdigit() else "")


def read_journal(host: Host, unit: str) -> SourceScan:
    """The unit's journal since its last start, else this boot's messages.

    By time, not by `_SYSTEMD_INVOCATION_ID`: journald reads that id when it reads a line, and a line
    written just before the process exited (a traceback's last line) is read after the process is gone,
    so it carries the unit's name but no id (seen on systemd 252 for a service that fails at once)."""
    invocation, started = _last_start(host, unit)
    if started:
        select_unit, since = ["--unit", unit, "--since", started], "since its last start"
    elif invocation:
        select_unit = [f"_SYSTEMD_INVOCATION_ID={invocation}"]
        since = "since its last start (by invocation id; lines written as it exited may be missing)"
    else:
        select_unit, since = ["--unit", unit, "--boot"], "this boot (no start recorded)"
    text = _journal(host, unit, "--output=short-iso", "--lines", str(JOURNAL_LINES), *select_unit)
    scanner = Scanner()
    scanner.feed(text.encode("utf-8", "replace"))
    cut = f"the last {JOURNAL_LINES} lines at most" if text.count("\n") >= JOURNAL_LINES else ""
    return SourceScan(f"journal of {unit} {since}", "journal", scanner.finish(), cut)
