"""Secrets: the one API-key file reader, and the one redaction every report and snapshot goes through.

Reading: `--api-key-file` of unit, serve, smoke and bench is read here and nowhere else: a regular file
only (a FIFO would hang the read, /dev/zero would fill memory), opened non-blocking, at most
MAX_KEY_FILE_BYTES, UTF-8, one key of the characters a Bearer token uses (RFC 6750: A-Z a-z 0-9
. _ ~ + / - =), which an EnvironmentFile= line and an HTTP header both carry unchanged.

Redaction, by rule rather than by list (the material is pasted into public bug reports):
- a command-line flag whose name is any prefix of a secret-bearing vLLM flag (`--api-ke KEY`, vLLM
  accepts abbreviations) or whose name has a secret word (`--token=T`, `--hf-token T`): its value,
  in both the `--flag=value` and the `--flag value ...` forms, whole (a value holding spaces included);
- an environment assignment `NAME=value` (argv of `sudo`/`env`, `sh -c` text, an environment map) whose
  NAME is secret: `*_TOKEN`, `*_KEY`, `*SECRET*`, `*PASSWORD*` (HF_TOKEN, VLLM_API_KEY, AWS_SECRET_...);
- the userinfo of a URL (`https://user:TOKEN@host/` -> `https://***@host/`).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rocmdoctor.vllm.flags import FLAGS

REDACTED = "***"
MAX_KEY_FILE_BYTES = 4096
API_KEY_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]+")
MAX_KEY_LENGTH = 512
SECRET_WORDS = ("key", "token", "secret", "password", "passwd", "apikey", "credential", "credentials")
_SECRET_NAME = re.compile(r"(^|_)(KEY|TOKEN|APIKEY)$|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s\"']+@")
# Within free text (an `sh -c` argument): a flag and its value, or NAME=value; quoted values whole.
_VALUE = r"(\"[^\"]*\"|'[^']*'|[^\s\"']+)"
_TEXT_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][A-Za-z0-9_.-]*)(=|\s+)" + _VALUE)
_TEXT_ASSIGNMENT = re.compile(r"(?<![\w-])([A-Za-z_][A-Za-z0-9_]*)=" + _VALUE)


class KeyFileError(ValueError):
    """The key file cannot be used; the message says why and what to do."""


def _secret_flag_names() -> tuple[str, ...]:
    """vLLM's long flags that carry a secret (--api-key, --hf-token): their every prefix is redacted."""
    return tuple(sorted({name for name, _ in FLAGS.values() if _has_secret_word(name)}))


def _has_secret_word(flag: str) -> bool:
    words = re.split(r"[-_.]+", flag.lstrip("-").lower())
    return any(word in SECRET_WORDS for word in words)


SECRET_FLAGS = _secret_flag_names()


def read_api_key(path: Path | str, min_length: int = 1, where: str | None = None) -> str:
    """The key in `path`: a regular file of at most MAX_KEY_FILE_BYTES holding one key (surrounding
    blank lines and spaces ignored), not a link, owned by us or root. Raises KeyFileError with the
    reason (naming the file as `where`, never its content); never blocks, never reads more than the limit.

    The link and owner rules are why `sudo -E` with `~/.cache/huggingface/token -> /etc/shadow` prints
    nothing of /etc/shadow: the link is refused before the open follows it."""
    where = where or f"--api-key-file {path}"
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise KeyFileError(
            f"{where}: no such file; write the key into it "
            "(e.g. `openssl rand -hex 32 > FILE; chmod 600 FILE`)"
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise KeyFileError(
                f"{where} is a symbolic link; refusing to follow it (give the file itself)"
            ) from None
        reason = "permission denied (run as its owner or root)" if exc.errno == errno.EACCES else exc.strerror
        raise KeyFileError(f"{where}: cannot open it ({reason})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_uid not in (os.geteuid(), 0):
            raise KeyFileError(
                f"{where} belongs to uid {info.st_uid}, neither you (uid {os.geteuid()}) nor root; "
                "a key file is read only from its owner (chown it, or copy it)"
            )
        if not stat.S_ISREG(info.st_mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(info.st_mode)
                else "a directory"
                if stat.S_ISDIR(info.st_mode)
                else "a device"
                if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                else "a socket"
                if stat.S_ISSOCK(info.st_mode)
                else "not a regular file"
            )
            raise KeyFileError(f"{where} is {kind}; give a regular file that holds the key")
        chunks, size = [], 0
        while size <= MAX_KEY_FILE_BYTES:
            chunk = os.read(fd, MAX_KEY_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise KeyFileError(f"{where}: cannot read it ({exc.strerror})") from None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    if len(raw) > MAX_KEY_FILE_BYTES:
        raise KeyFileError(f"{where} is larger than {MAX_KEY_FILE_BYTES} bytes; it should hold one key")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise KeyFileError(
            f"{where} is not UTF-8 text; it should hold one key such as `openssl rand -hex 32` prints"
        ) from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise KeyFileError(f"{where} is empty; put the key in it")
    if len(lines) > 1:
        raise KeyFileError(f"{where} holds {len(lines)} lines; it should hold one key")
    return check_token(lines[0], where, min_length)


def check_token(value: str, where: str, min_length: int = 1) -> str:
    """`value` if it is one token of the characters a Bearer header carries (RFC 6750); KeyFileError
    otherwise, without the value (a line break in it would make requests quote it in InvalidHeader)."""
    if not API_KEY_PATTERN.fullmatch(value) or not min_length <= len(value) <= MAX_KEY_LENGTH:
        raise KeyFileError(
            f"{where} must hold one key of {min_length}-{MAX_KEY_LENGTH} characters from "
            "A-Z a-z 0-9 . _ ~ + / = - (not shown; a line break or a space in it?) "
            "(e.g. `openssl rand -hex 32 > FILE`)"
        )
    register_secret(value)
    return value


# -- messages: the one redactor for every text that can quote a credential ---------------------------

_SECRETS: set[str] = set()
SECRET_ENV = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "VLLM_API_KEY",
    "LEMONADE_ADMIN_API_KEY",
    "LEMONADE_API_KEY",
)
_HEADER = re.compile(
    r"(?i)\b(authorization|proxy-authorization|x-api-key|api-key|cookie)(['\"]?\s*[:=]\s*['\"]?)"
    r"((?:bearer|basic|token)\s+)?[^\s'\",}]+"
)
_SCHEME_TOKEN = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]+")
# The shapes of the credentials rocmdoctor meets: Hugging Face and GitHub tokens.
_KNOWN_TOKEN = re.compile(r"\b(hf_[A-Za-z0-9]{8,}|gh[pousr]_[A-Za-z0-9]{8,}|github_pat_[A-Za-z0-9_]{8,})")


def register_secret(value: str) -> None:
    """A credential this process holds: its exact text is redacted from every message from now on."""
    if len(value) >= 4:
        _SECRETS.add(value)


def register_url(url: str) -> None:
    """The password (and user) of a URL's userinfo, as typed and percent-decoded: secrets of this run."""
    from urllib.parse import unquote, urlsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return
    userinfo = parts.netloc.rpartition("@")[0]
    if userinfo:
        import base64

        user, colon, password = userinfo.partition(":")
        if not colon:
            return  # a user name alone (`admin`) is no secret; printed in a URL it is redacted anyway
        for value in (userinfo, password):
            register_secret(value)
            register_secret(unquote(value))
        # as an HTTP client sends it: Authorization: Basic base64(user:password)
        register_secret(base64.b64encode(unquote(userinfo).encode("utf-8", "surrogateescape")).decode())


def _forms(secret: str) -> set[str]:
    """The ways a secret is quoted in output: as is, repr (Python messages), JSON, percent-encoded."""
    import json
    from urllib.parse import quote

    return {secret, repr(secret)[1:-1], json.dumps(secret)[1:-1], quote(secret, safe=""), secret.strip()}


def redact_known(text: str) -> str:
    """What this run knows to be secret, replaced on every output path (people, --json, errors, a child's
    log): each registered secret and the values of the usual secret variables, exactly, and the
    userinfo of URLs. Exact matches only, so nothing else of a report changes."""
    secrets = set(_SECRETS)
    secrets.update(v for name in SECRET_ENV if len(v := os.environ.get(name, "")) >= 4)
    for secret in sorted(secrets, key=len, reverse=True):
        for form in _forms(secret):
            if len(form) >= 4:
                text = text.replace(form, REDACTED)
        for part in secret.split():  # a token with a line break is quoted in pieces
            if len(part) >= 4:
                text = text.replace(part, REDACTED)
    return redact_url(text)


class RedactingStream:
    """stdout or stderr through `redact_known`: whatever a command prints (click.echo, --json, an error,
    a server's log tail) passes the one redactor, whichever code path printed it."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: Any) -> Any:
        return self._stream.write(redact_known(text) if isinstance(text, str) else text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def redacted_output() -> Iterator[None]:
    """sys.stdout and sys.stderr through the redactor for the duration of a command."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RedactingStream(saved[0]), RedactingStream(saved[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def redact_message(text: str) -> str:
    """A message or exception text fit to print: credentials this process holds (registered, or in the
    usual environment variables), Authorization-like headers, Bearer/Basic values, token shapes, secret
    flags and assignments, and URL userinfo, replaced by ***."""
    text = redact_known(text)
    text = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3) or ''}{REDACTED}", text)
    text = _SCHEME_TOKEN.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _KNOWN_TOKEN.sub(REDACTED, text)
    return redact_text(text)


def redact_exception(exc: BaseException, limit: int = 300) -> str:
    """`Type: message` of an exception, redacted and cut to `limit` characters."""
    return f"{type(exc).__name__}: {redact_message(str(exc))}"[:limit]


def is_secret_name(name: str) -> bool:
    """An environment variable whose value is a secret: *_TOKEN, *_KEY, *SECRET*, *PASSWORD*."""
    return bool(_SECRET_NAME.search(name))


def is_secret_flag(word: str) -> bool:
    """`word` (a flag, maybe with =value) names a secret: any prefix of a secret vLLM flag (vLLM takes
    abbreviations), or a name with a secret word in it."""
    if not word.startswith("-") or word in ("-", "--"):
        return False
    name = word.split("=", 1)[0]
    if name.startswith("--"):
        long_name = "--" + name[2:].replace("_", "-").split(".", 1)[0].lower()
        if len(long_name) > 2 and any(flag.startswith(long_name) for flag in SECRET_FLAGS):
            return True
    return _has_secret_word(name)


def redact_url(text: str) -> str:
    return _URL_USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)


def redact_text(text: str) -> str:
    """Free text (a shell command line): secret flags' values, secret assignments and URL userinfo."""

    def flag(match: re.Match[str]) -> str:
        if not is_secret_flag(match.group(1)):
            return match.group(0)
        return f"{match.group(1)}{match.group(2)}{REDACTED}"

    def assignment(match: re.Match[str]) -> str:
        return f"{match.group(1)}={REDACTED}" if is_secret_name(match.group(1)) else match.group(0)

    return _TEXT_ASSIGNMENT.sub(assignment, _TEXT_FLAG.sub(flag, redact_url(text)))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A process's argv fit for a report: same length, secrets replaced by ***. A secret value is replaced
    whole, spaces and all (`VLLM_API_KEY=a b`, `--api-key=a b`); other words holding spaces (`sh -c TEXT`)
    are redacted as shell text."""
    out: list[str] = []
    taking = False  # the words after a secret flag given without =, until the next option
    for word in argv:
        if taking and not (word.startswith("-") and len(word) > 1):
            out.append(REDACTED)
            continue
        taking = False
        assignment = _ASSIGNMENT.match(word)
        if is_secret_flag(word):
            if "=" in word:
                out.append(f"{word.split('=', 1)[0]}={REDACTED}")
            else:
                out.append(word)
                taking = True
        elif assignment and is_secret_name(assignment.group(1)):
            out.append(f"{assignment.group(1)}={REDACTED}")
        elif any(c.isspace() for c in word):
            out.append(redact_text(word))
        else:
            out.append(redact_url(word))
    return out


def redact_cmdline(raw: str) -> str:
    """/proc/PID/cmdline text (NUL-terminated argv words) with the same separators, secrets replaced."""
    end = "\x00" if raw.endswith("\x00") else ""
    return "\x00".join(redact_argv(raw[: len(raw) - len(end)].split("\x00"))) + end


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """An environment with the values of secret variables replaced and URL userinfo removed."""
    return {name: REDACTED if is_secret_name(name) else redact_url(value) for name, value in env.items()}
