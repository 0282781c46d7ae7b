"""The click parameter types every command declares its options with: values are checked once, at the edge.

A bad value is exit 2 with click's "Invalid value for '--OPTION'" and the accepted range, before any
work starts and before anything is allocated in proportion to it. Kinds of value, one type each:

- `Duration`: seconds, finite, within (min, max]; `nan`, `inf`, `0`, `-5` and `1e30` are refused.
- `Port`: a TCP port, 1-65535, written as digits.
- `Fraction`: a share in [min, 1] (`--gpu-memory-utilization`); the minimum keeps values that would be
  written as `0.00` out.
- `Count`: a whole number within [min, max].
- `CountList`: comma-separated counts (`--concurrency 1,2,4`), returned in canonical form.
- `HostName`: an IP address or DNS name to listen on or connect to (no spaces, no shell words).
- `Prefix`: an install prefix: absolute, normalised, not `/`, no whitespace or control characters. It
  becomes the first word of a systemd `ExecStart=`, where a leading `+ - @ ! :` changes how systemd
  runs it (`+` runs it as root outside the sandbox), so the rule is checked wherever a prefix enters.
- `AbsolutePath` / `NonEmptyPath`: paths that are never the empty string (which means "here").
- `ModelName`: a model id, directory or served name; never empty, never starting with `-` (vLLM would read
  `--model -h` as its help flag and exit 0).
- `UserName` / `ServiceUser`: account names; the service account is never root or nobody.

`VllmPassThrough` is the command class of `unit` and `serve`: their vLLM arguments come after `--`, and an
option rocmdoctor does not know is an error there, never handed to vLLM.
"""

from __future__ import annotations

import ipaddress
import math
import os
import posixpath
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

# systemd reads these as modifiers when they start an ExecStart= path ("+" = full privileges).
SYSTEMD_EXEC_PREFIXES = "+-@!:|"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DNS_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_LOOSE_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\$?")
# Accounts that must never run the vLLM server (systemd warns about nobody: files it owns are shared
# with every other service that uses it; root defeats the unit's sandbox).
FORBIDDEN_SERVICE_USERS = {
    "root": "root would own everything the server writes and undo the unit's sandbox",
    "nobody": "systemd refuses to treat nobody as safe "
    '("Special user nobody configured, this is not safe!"): every service that runs as nobody could '
    "read the model cache and the key",
    "nfsnobody": "it is the NFS nobody account (see nobody)",
}
MAX_DURATION_S = 7 * 24 * 3600


def _number(value: float) -> str:
    return f"{value:g}"


class Duration(click.ParamType):
    """Seconds: a finite number in (min_s, max_s] (or [min_s, max_s] when `inclusive`)."""

    name = "seconds"

    def __init__(
        self, max_s: float = MAX_DURATION_S, min_s: float = 0.0, inclusive: bool = False, whole: bool = False
    ) -> None:
        self.max_s, self.min_s, self.inclusive, self.whole = max_s, min_s, inclusive, whole

    def describe(self) -> str:
        low = "[" if self.inclusive else "("
        kind = "whole seconds" if self.whole else "seconds"
        return f"{kind} in {low}{_number(self.min_s)}, {_number(self.max_s)}]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        else:
            try:
                number = float(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not a number; give {self.describe()}", param, ctx)
        low_ok = number >= self.min_s if self.inclusive else number > self.min_s
        if not math.isfinite(number) or not low_ok or number > self.max_s:
            self.fail(f"{value!r} is out of range; give {self.describe()}", param, ctx)
        if self.whole:
            if number != int(number):
                self.fail(f"{value!r} is not a whole number; give {self.describe()}", param, ctx)
            return int(number)
        return number


class Rate(Duration):
    """Bytes per second: a finite number in (0, max]."""

    name = "bytes/s"

    def __init__(self, max_rate: float = 1e12) -> None:
        super().__init__(max_s=max_rate)

    def describe(self) -> str:
        return f"bytes/s in (0, {_number(self.max_s)}]"


class Count(click.ParamType):
    """A whole number in [min_value, max_value], written as digits."""

    name = "integer"

    def __init__(self, min_value: int = 1, max_value: int = 1 << 20) -> None:
        self.min_value, self.max_value = min_value, max_value

    def describe(self) -> str:
        return f"a whole number from {self.min_value} to {self.max_value}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            text = str(value).strip()
            if not re.fullmatch(r"[+-]?\d{1,20}", text):
                self.fail(f"{value!r} is not {self.describe()}", param, ctx)
            number = int(text)
        if not self.min_value <= number <= self.max_value:
            self.fail(f"{value!r} is out of range; give {self.describe()}", param, ctx)
        return number


class Port(Count):
    name = "port"

    def __init__(self) -> None:
        super().__init__(1, 65535)

    def describe(self) -> str:
        return "a TCP port from 1 to 65535"


class CountList(click.ParamType):
    """Comma-separated whole numbers in [min_value, max_value]; returned sorted, unique, as text."""

    name = "list"

    def __init__(self, min_value: int = 1, max_value: int = 1024, max_items: int = 32) -> None:
        self.count = Count(min_value, max_value)
        self.max_items = max_items

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        parts = str(value).split(",")
        if len(parts) > self.max_items:
            self.fail(f"{len(parts)} values; give at most {self.max_items}", param, ctx)
        try:
            numbers = sorted({self.count.convert(part, param, ctx) for part in parts})
        except click.BadParameter:
            self.fail(
                f"{value!r}: give positive whole numbers separated by commas, each from "
                f"{self.count.min_value} to {self.count.max_value}, e.g. 1,2,4,8,16",
                param,
                ctx,
            )
        return ",".join(map(str, numbers))


class Fraction(click.ParamType):
    """A share of something in [min_value, 1]."""

    name = "fraction"

    def __init__(self, min_value: float = 0.01) -> None:
        self.min_value = min_value

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        accepted = f"give a number from {_number(self.min_value)} to 1"
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number; {accepted}", param, ctx)
        if not math.isfinite(number) or not self.min_value <= number <= 1:
            self.fail(f"{value!r} is out of range; {accepted}", param, ctx)
        return number


def host_problem(text: str) -> str | None:
    """Why `text` is not an IP address or DNS name (None when it is one)."""
    if not text:
        return "the host is empty"
    try:
        ipaddress.ip_address(text)
        return None
    except ValueError:
        pass
    name = text.removesuffix(".")
    if len(name) > 253 or not all(_DNS_LABEL.fullmatch(label) for label in name.split(".")):
        return "not an IP address or a host name (letters, digits, '-' and '.' only)"
    return None


class HostName(click.ParamType):
    name = "host"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        problem = host_problem(str(value))
        if problem:
            self.fail(f"{value!r}: {problem}; e.g. 127.0.0.1, 0.0.0.0, ::1 or gpu01.example.org", param, ctx)
        return str(value)


MAX_URL = 2048


def url_problem(text: str) -> str | None:
    """Why `text` is not the http(s) URL of a server (None when it is one): bytes that are not UTF-8
    (a lone surrogate from the command line), control characters, another scheme, a host that is no
    IP address or host name, a port out of range."""
    from urllib.parse import urlsplit

    if len(text) > MAX_URL:
        return f"longer than {MAX_URL} characters"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "holds bytes that are not UTF-8 text"
    if not text.isprintable() or any(c.isspace() for c in text):
        return "holds a space or a control character"
    try:
        parts = urlsplit(text)
    except ValueError as exc:
        return f"cannot be read as a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return "is not an http(s) URL"
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        return "has an invalid port (1 to 65535)"
    return host_problem(parts.hostname or "")


class ServerUrl(click.ParamType):
    """The URL of a server rocmdoctor talks to (vLLM, Lemonade): checked at the edge, exit 2."""

    name = "url"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value)
        problem = url_problem(text)
        if problem:
            shown = ascii(text[:200])
            self.fail(f"{shown} {problem}; give a URL such as http://127.0.0.1:8000", param, ctx)
        return text


class NonEmptyText(click.ParamType):
    """A value that must say something: an empty or blank one is refused (exit 2), never read as the
    option left out."""

    name = "text"

    def __init__(self, example: str) -> None:
        self.example = example

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value)
        if not text.strip():
            self.fail(f"is empty; give a value such as {self.example}, or leave the option out", param, ctx)
        return text


def path_problem(text: str, absolute: bool = True) -> str | None:
    """Why `text` is not an acceptable path (None when it is)."""
    if not text:
        return "the path is empty (that would mean the current directory)"
    if _CONTROL.search(text):
        return "it holds control characters (newline, tab, NUL)"
    if absolute and not text.startswith("/"):
        if text[0] in SYSTEMD_EXEC_PREFIXES:
            return (
                f"it starts with {text[0]!r}, which systemd reads as an ExecStart= modifier "
                "('+' would run the server as root outside the sandbox)"
            )
        return "it is relative; give an absolute path (starting with /)"
    return None


def prefix_problem(text: str) -> str | None:
    """Why `text` is not an install prefix (None when it is): the rule of the Prefix type, also applied
    where a prefix reaches ExecStart= without the command line (provision.unit.ServiceLayout)."""
    problem = path_problem(text)
    if problem:
        return problem
    if re.search(r"\s", text):
        return "it holds whitespace"
    parts = text.split("/")
    if "." in parts or ".." in parts:
        return "it holds '.' or '..' components; give the normalised path"
    if posixpath.normpath(text) == "/":
        return "it is / itself; give a directory such as /opt/rocmdoctor"
    return None


class Prefix(click.ParamType):
    """An install prefix, returned normalised (no duplicate or trailing slashes) as str or Path."""

    name = "directory"

    def __init__(self, path_type: type = str) -> None:
        self.path_type = path_type

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
        problem = prefix_problem(text)
        if problem:
            self.fail(f"{text!r}: {problem}; e.g. /opt/rocmdoctor", param, ctx)
        return self.path_type(posixpath.normpath(text))


class AbsolutePath(click.ParamType):
    """An absolute path, returned normalised."""

    name = "path"

    def __init__(self, path_type: type = Path) -> None:
        self.path_type = path_type

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
        problem = path_problem(text)
        if problem:
            self.fail(f"{text!r}: {problem}", param, ctx)
        return self.path_type(posixpath.normpath(text))


class NonEmptyPath(click.Path):
    """click.Path that refuses the empty string and control characters (relative paths are fine)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
        problem = path_problem(text, absolute=False)
        if problem:
            self.fail(f"{text!r}: {problem}", param, ctx)
        return super().convert(value, param, ctx)


def name_problem(text: str) -> str | None:
    """Why `text` cannot be a model or served-model name (None when it can)."""
    if not text.strip():
        return "it is empty"
    if text.startswith("-"):
        return "it starts with '-', so vLLM would read it as an option (--model -h prints help and exits 0)"
    if _CONTROL.search(text):
        return "it holds control characters (newline, tab, NUL)"
    if len(text) > 4096:
        return "it is longer than 4096 characters"
    return None


class ModelName(click.ParamType):
    name = "name"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        problem = name_problem(str(value))
        if problem:
            self.fail(f"{str(value)!r}: {problem}", param, ctx)
        return str(value)


class UserName(click.ParamType):
    """An account name as useradd and systemd accept it (the check's --user may name any account)."""

    name = "user"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = str(value)
        if not _LOOSE_USER.fullmatch(text):
            self.fail(
                f"{text!r} is not an account name (letters, digits, '_', '-', '.'; at most 32)", param, ctx
            )
        return text


def service_user_problem(name: str) -> str | None:
    if not _USER.fullmatch(name):
        return "not a valid system user name (lower case letters, digits, '-' and '_', at most 32)"
    if name in FORBIDDEN_SERVICE_USERS:
        return f"{FORBIDDEN_SERVICE_USERS[name]}; use a dedicated account such as vllm (created if missing)"
    return None


class ServiceUser(click.ParamType):
    """The account the vLLM service runs as: a system user name, never root or nobody."""

    name = "user"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        problem = service_user_problem(str(value))
        if problem:
            self.fail(f"{str(value)!r}: {problem}", param, ctx)
        return str(value)


def refuse_empty_env(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """click treats an empty environment variable as unset and falls back to the default; for a
    prefix that silently means another directory, so an empty ROCMDOCTOR_PREFIX is an error."""
    envvars = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar or ())
    source = ctx.get_parameter_source(param.name or "")
    if source is click.core.ParameterSource.DEFAULT:
        for name in envvars:
            if os.environ.get(name) == "":
                raise click.BadParameter(
                    f"{name} is set but empty; unset it or give a directory such as /opt/rocmdoctor",
                    ctx=ctx,
                    param=param,
                )
    return value


class VllmPassThrough(click.Command):
    """A command whose vLLM arguments follow `--`; before it only rocmdoctor's own options are allowed.

    The words after the first `--` reach the command as the parameter `extra` (a tuple), never parsed
    by click; a word before it that is not one of the command's options is an error (exit 2) that
    says where vLLM's arguments go, so a typo of a rocmdoctor option never lands in ExecStart.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            split = args.index("--")
            head, tail = list(args[:split]), tuple(args[split + 1 :])
        else:
            head, tail = list(args), ()
        try:
            rest = super().parse_args(ctx, head)
        except click.NoSuchOption as exc:
            from rocmdoctor.vllm.flags import FLAGS

            name = exc.option_name.split("=", 1)[0]
            exc.message = exc.message.rstrip(".")  # type: ignore[misc]
            if name in FLAGS:
                exc.message = (  # type: ignore[misc]
                    f"{exc.message}: {name} is vLLM's, and vLLM's own arguments go after `--`: "
                    f"rocmdoctor {ctx.info_name} --model M -- {name} ..."
                )
            else:
                exc.message = (  # type: ignore[misc]
                    f"{exc.message}: rocmdoctor {ctx.info_name} does not know it (see --help); "
                    "vLLM's own arguments go after `--`"
                )
            raise
        except click.UsageError as exc:
            if "unexpected extra argument" in exc.message:
                exc.message += (  # type: ignore[misc]
                    f"; vLLM's own arguments go after `--`: rocmdoctor {ctx.info_name} --model M -- ..."
                )
            raise
        ctx.params["extra"] = tail
        return rest

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        return [*super().collect_usage_pieces(ctx), "[-- VLLM_ARGS...]"]


def product_limit(names: tuple[str, str], limit: int, what: str) -> Any:
    """A callback for both of two count options: their product (what is built up front from them) must
    stay within `limit`. Whichever click processes second sees the other's value and checks."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        other = names[1] if param.name == names[0] else names[0]
        if value is not None and ctx.params.get(other) is not None and value * ctx.params[other] > limit:
            options = " x ".join(f"--{name.replace('_', '-')}" for name in names)
            raise click.BadParameter(
                f"{options} = {value * ctx.params[other]} {what}; at most {limit} "
                "(they are built before the first request)",
                ctx=ctx,
                param=param,
            )
        return value

    return callback


def key_file(min_length: int = 1) -> Any:
    """A callback for --api-key-file: the file is read (by the one reader) when the option is parsed, so a
    FIFO, /dev/zero or a malformed key is exit 2 before any work starts."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is None:
            return None
        from rocmdoctor.sensitive import KeyFileError, read_api_key

        try:
            read_api_key(value, min_length=min_length, where=str(value))
        except KeyFileError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
        return value

    return callback


def prefix_option(help: str, **prefix_type: Any) -> Callable[[Any], Any]:
    """`--prefix` as every command takes it: ROCMDOCTOR_PREFIX, the one default, validated, never empty."""
    from rocmdoctor.registry import DEFAULT_PREFIX

    return click.option(
        "--prefix",
        default=DEFAULT_PREFIX,
        envvar="ROCMDOCTOR_PREFIX",
        show_default=True,
        type=Prefix(**prefix_type),
        callback=refuse_empty_env,
        help=f"{help} [env: ROCMDOCTOR_PREFIX]",
    )
