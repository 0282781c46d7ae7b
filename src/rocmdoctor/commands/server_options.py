"""The options of the vLLM server commands (`unit`, `serve`, `instances`), each declared once.

A command takes the ones it needs, in the order its --help shows them (`server_options`), and may say in
its own words what an option means there (`help=`) or set another default; the flag, the parameter name,
the type and the checks are the ones declared here, so `--api-key-file` is read under one rule everywhere.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from rocmdoctor import params

LAYOUT_CHOICES = ("one", "per-gpu", "per-partition")
PREFIX_HELP = "Where `rocmdoctor install` put the bundles."

# name -> (click's parameter declarations, click.option's keywords)
OPTIONS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "gpu": (
        ("--gpu", "gpus"),
        {
            "multiple": True,
            "help": "The GPU to serve on, by PCI slot (0000:03:00.0) or KFD node (node:2); repeat for tensor "
            "parallelism. Needed on a host whose GPUs of several families leave the choice open.",
        },
    ),
    "model": (
        ("--model",),
        {"type": params.ModelName(), "help": "Hugging Face id or local model directory."},
    ),
    "served_model_name": (
        ("--served-model-name",),
        {
            "default": None,
            "type": params.ModelName(),
            "help": "Name clients ask for (default: the model's last path part).",
        },
    ),
    "host": (
        ("--host",),
        {
            "default": "127.0.0.1",
            "show_default": True,
            "type": params.HostName(),
            "help": "Address to listen on.",
        },
    ),
    "port": (
        ("--port",),
        {"default": 8000, "show_default": True, "type": params.Port(), "help": "Port to listen on."},
    ),
    "gpu_memory_utilization": (
        ("--gpu-memory-utilization",),
        {
            "type": params.Fraction(0.01),
            "default": None,
            "help": "Override the value computed from the free memory of the GPU (or APU pool): 0.01-1.",
        },
    ),
    "max_model_len": (
        ("--max-model-len",),
        {
            "type": params.Count(1, 1 << 24),
            "default": None,
            "help": "Context length (default: the model's).",
        },
    ),
    "max_num_seqs": (
        ("--max-num-seqs",),
        {
            "type": params.Count(1, 1 << 16),
            "default": None,
            "help": "Concurrent sequences (default: 10 on a unified-memory APU, vLLM's otherwise).",
        },
    ),
    "tensor_parallel_size": (
        ("--tensor-parallel-size",),
        {
            "type": params.Count(1, 64),
            "default": None,
            "help": "Spread the model over this many GPUs of one family.",
        },
    ),
    "api_key_file": (
        ("--api-key-file",),
        {
            "type": params.NonEmptyPath(dir_okay=False, path_type=Path),
            "default": None,
            "callback": params.key_file(min_length=8),
            "help": "File holding the API key clients must send (never pass --api-key itself).",
        },
    ),
    "vllm_args": (
        ("--vllm-args",),
        {
            "default": "",
            "metavar": "TEXT",
            "help": "More vLLM arguments as one string, split like a shell would (never run by one).",
        },
    ),
    "json": (
        ("--json", "as_json"),
        {"is_flag": True, "help": "Machine-readable output on stdout."},
    ),
    "user": (
        ("--user",),
        {
            "default": "vllm",
            "show_default": True,
            "type": params.ServiceUser(),
            "help": "Service account (created with its groups if missing; never root or nobody).",
        },
    ),
    "timeout": (
        ("--timeout", "timeout_s"),
        {
            "default": 1800,
            "show_default": True,
            "type": params.Duration(whole=True),
            "help": "Seconds systemd waits for the model to load and answer a completion.",
        },
    ),
    "write": (
        ("--write",),
        {"is_flag": True, "help": "Write the unit, its env file and readiness script (else print the unit)."},
    ),
    "check": (
        ("--check", "check_only"),
        {"is_flag": True, "help": "Show what --write would change (diff, accounts), change nothing."},
    ),
    "target": (
        ("--target",),
        {
            "default": None,
            "type": params.NonEmptyPath(file_okay=False, exists=True, path_type=Path),
            "help": "Write into this tree (an image being prepared, a test root) instead of this host. "
            "--root only reads: with --root, name the tree to write into here.",
        },
    ),
}


def server_option(name: str, **changes: Any) -> Callable[[Any], Any]:
    """One option of OPTIONS (or `prefix`), with the command's own `changes` (help text, default)."""
    if name == "prefix":
        return params.prefix_option(changes.get("help", PREFIX_HELP))
    declarations, keywords = OPTIONS[name]
    return click.option(*declarations, **{**keywords, **changes})


def server_options(*options: str | Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Several options as one decorator, in --help order: a name of OPTIONS, "prefix", or a decorator
    (`server_option(name, help=...)`, or an option of the command's own)."""
    decorators = [server_option(o) if isinstance(o, str) else o for o in options]

    def apply(fn: Any) -> Any:
        return functools.reduce(lambda f, option: option(f), reversed(decorators), fn)

    return apply


# One server's options (`unit`, `serve`, `cluster unit`), after the command's own, in this order.
SINGLE_SERVER_OPTIONS: tuple[str | Callable[[Any], Any], ...] = (
    server_option("model", required=True),
    "served_model_name",
    "host",
    "port",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "tensor_parallel_size",
    "gpu",
    "api_key_file",
    "vllm_args",
    "prefix",
    "json",
)
SINGLE_SERVER = server_options(*SINGLE_SERVER_OPTIONS)


def choices(opts: dict[str, Any], **changes: Any) -> Any:
    """The server's Choices from the parsed options (--vllm-args, then the words after `--`); `changes`
    replace what one instance of several decides for itself. Raises provision's ArgumentError. The
    arguments are judged for the vLLM of the bundle current under --prefix (provision/bundle/ask_vllm)."""
    from rocmdoctor.provision.bundle.ask_vllm import for_prefix
    from rocmdoctor.provision.server.args import Choices, parse_extra

    asked = {
        "model": opts["model"],
        "served_model_name": opts["served_model_name"],
        "host": opts["host"],
        "port": opts["port"],
        "gpu_memory_utilization": opts["gpu_memory_utilization"],
        "max_model_len": opts["max_model_len"],
        "max_num_seqs": opts["max_num_seqs"],
        "tensor_parallel_size": opts["tensor_parallel_size"],
        "extra": parse_extra(opts["vllm_args"]) + list(opts["extra"]),
        "vllm": for_prefix(opts["prefix"]) if opts.get("prefix") else None,
    }
    return Choices(**{**asked, **changes})


@dataclass(frozen=True)
class ServerOptions:
    """The server options a command took (OPTIONS' parameter names), typed; `server_group` hands the
    command one. Options the command does not declare keep their defaults."""

    model: str
    prefix: str
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    tensor_parallel_size: int | None = None
    gpus: tuple[str, ...] = ()
    api_key_file: Path | None = None
    vllm_args: str = ""
    as_json: bool = False
    extra: tuple[str, ...] = ()  # the words after `--` (params.VllmPassThrough)

    def as_dict(self) -> dict[str, Any]:
        """The shape `serve.resolve_args`, `choices` and `api_key` read."""
        return dataclasses.asdict(self)


def server_group(*options: str | Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`server_options(*options)`, handed to the command as one `ServerOptions` (keyword `server`)."""
    names = {f.name for f in dataclasses.fields(ServerOptions)}

    def decorate(fn: Any) -> Any:
        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            taken = {name: kwargs.pop(name) for name in list(kwargs) if name in names}
            return fn(*args, server=ServerOptions(**taken), **kwargs)

        return server_options(*options)(command)

    return decorate


# `unit` and `serve`: the same options as one typed ServerOptions (keyword `server`).
SINGLE_SERVER_GROUP = server_group(*SINGLE_SERVER_OPTIONS)
