"""The bundles' vLLM versions asked directly: each version's own CLI modules and parser (tests/harness/
vllm_versions.py), not a model of them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from harness.vllm_versions import VERSIONS, python_and_env
from rocmdoctor.cluster.layout import ClusterLayout

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "provision" / "server" / "vllm_serve.py"

pytestmark = pytest.mark.system

# What the cluster worker's unit passes after the launcher (provision/server/cluster_unit.py): the
# model's own arguments and the layout's, here a data-parallel worker (rank 1: --headless).
WORKER_ARGS = ["--model", "/srv/models/tiny", *ClusterLayout(2, "10.0.0.1", layout="data").vllm_args(1)]

ASK = """
import importlib.util, json, runpy, sys, warnings
warnings.simplefilter("ignore")
given = json.loads(sys.stdin.read())
import vllm
spec = importlib.util.spec_from_file_location("vllm_serve", given["launcher"])
launcher = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launcher)
command, args = launcher.serve_command(given["worker"])
import vllm.entrypoints.cli.serve as serve
from vllm.utils.argparse_utils import FlexibleArgumentParser
parsed = []
for argv in given["argvs"]:
    try:
        got = serve.make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
        parsed.append([True, got.max_num_seqs])
    except SystemExit as exc:
        parsed.append([False, exc.code])
answer = {
    "version": vllm.__version__,
    "env_setup": launcher.env_setup_module(),
    "command": type(command).__module__,
    "model": args.model_tag or args.model,  # `vllm serve` moves --model to model_tag; cmd() reads it
    "headless": args.headless,
    "start_rank": args.data_parallel_start_rank,
    "runs": callable(command.validate) and callable(command.cmd),
    "surface": json.dumps(runpy.run_path(given["probe"])["surface"](), indent=1, sort_keys=True) + "\\n",
    "parsed": parsed,
}
print("ANSWER " + json.dumps(answer))
"""
SURFACE_PROBE = REPO / "src" / "rocmdoctor" / "probes" / "vllm_surface.py"
NEWER_ONLY = "--max-num-scheduled-tokens"  # the example: 0.32 only, no prefix of an older flag


def host_classes():
    from rocmdoctor.provision.server.args import GpuPool

    gib = 1 << 30
    return {
        "unified": [GpuPool("node 1 (gfx1151)", "gfx1151", 96 * gib, 90 * gib, True)],
        "discrete": [GpuPool("node 1 (gfx1201)", "gfx1201", 32 * gib, 31 * gib, False)],
        "discrete-large": [GpuPool("node 1 (gfx942)", "gfx942", 192 * gib, 190 * gib, False)],
    }


def written_argvs(version: str) -> list[list[str]]:
    """What unit/serve write for each host class, judged with the version's shipped table."""
    from rocmdoctor.provision.server.args import Choices, resolve
    from rocmdoctor.vllm.surface import shipped

    extras = ([], ["--enforce-eager", "--dtype", "bfloat16"], ["--max-num-batched-tokens=2048"])
    return [
        resolve(Choices(model="/srv/models/tiny", extra=extra, vllm=shipped(version)), pools).argv()
        for pools in host_classes().values()
        for extra in extras
    ]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("version", VERSIONS)
def test_each_bundled_version_answers_for_itself(version):
    """One run of each version (its interpreter imports vLLM once, the costly part):
    - the cluster launcher (libexec/vllm-serve) builds `vllm serve` on it: it imported
      vllm.entrypoints.launchers.cli_args, which only 0.32 has, so multi-node bring-up failed on every
      bundle that exists;
    - the shipped table src/rocmdoctor/vllm/surfaces/<version>.json is its own parser's answer, byte for
      byte (regenerate: the probe under harness.vllm_versions.python_and_env(version));
    - the arguments unit/serve write for each host class parse with its own parser, and the flag
      rocmdoctor refuses for it as too new is refused by that parser too (exit 2)."""
    from rocmdoctor.provision.server.args import ArgumentError, Choices, resolve
    from rocmdoctor.vllm.surface import shipped

    argvs = written_argvs(version)
    too_new = NEWER_ONLY not in shipped(version).flags
    if too_new:
        with pytest.raises(
            ArgumentError, match=rf"{NEWER_ONLY} needs vLLM 0\.32\.0 or newer; the bundle has vLLM {version}"
        ):
            resolve(
                Choices(model="/srv/models/tiny", extra=[NEWER_ONLY, "1"], vllm=shipped(version)),
                host_classes()["unified"],
            )
        argvs.append(["--model", "/srv/models/tiny", NEWER_ONLY, "1"])
    python, env = python_and_env(version)
    given = {"launcher": str(LAUNCHER), "probe": str(SURFACE_PROBE), "worker": WORKER_ARGS, "argvs": argvs}
    done = subprocess.run(
        [str(python), "-c", ASK],
        input=json.dumps(given),
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("ANSWER "))
    got = json.loads(line.removeprefix("ANSWER "))
    assert got["version"] == version
    assert got["command"] == "vllm.entrypoints.cli.serve"
    assert got["env_setup"] in ("vllm.entrypoints.utils", "vllm.entrypoints.serve.utils.api_utils")
    assert (got["model"], got["headless"], got["start_rank"], got["runs"]) == (
        "/srv/models/tiny",
        True,
        1,
        True,
    )
    assert (
        got["surface"] == (REPO / "src" / "rocmdoctor" / "vllm" / "surfaces" / f"{version}.json").read_text()
    )
    computed = got["parsed"][:9]
    assert all(ok for ok, _ in computed), list(zip(argvs, got["parsed"], strict=False))
    assert [seqs for _, seqs in computed[:3]] == [10, 10, 10]  # the unified class's cap reached vLLM
    if too_new:
        assert got["parsed"][-1] == [False, 2]


@pytest.mark.timeout(400)
def test_the_real_vllm_032_environment_as_a_bundle_qualifies_and_answers(tmp_path: Path):
    """The real vLLM 0.32 CPU environment (320 ELF files) laid out as a bundle, hard-linked: nothing that
    `import torch, vllm._C` loads fails; optional plugins nothing loads (libomptarget.rtl.level0.so needs
    libze_loader.so.1) are notes, not the 978 failures the static rule gave; vllm/_C's libnuma.so.1 is
    named as taken from this host; the import step runs, and in the same run the bundle's own vLLM answers
    with its flags, kept beside the qualification record and used for the arguments."""
    from harness.bundles import environment_as_bundle
    from rocmdoctor.host_writes import HostWriter
    from rocmdoctor.provision.bundle import ask_vllm, qualify
    from rocmdoctor.vllm import surface

    python, _ = python_and_env("0.32.0")
    prefix = tmp_path / "prefix"
    tree = environment_as_bundle(python, prefix / "vllm0.32.0-rocm7.0.0-gfx1151")
    options = qualify.QualifyOptions(import_timeout_s=360.0)
    qualify.qualify_tree(HostWriter().trees, tree, tree.name, [("bundle.tar.gz", None)], options)
    result = options.last
    assert result is not None and result.qualified, result.first_failure()
    assert result.failures == [] and result.elf_files > 300
    steps = {step.id: step for step in result.steps}
    assert steps["import"].status == "passed"
    libraries = steps["libraries"]
    assert any("libomptarget.rtl.level0.so needs libze_loader.so.1" in note for note in libraries.notes)
    assert any("vllm/_C.abi3.so takes libnuma.so.1 from this host" in note for note in libraries.notes)
    # the host's own loader listed every root of the closure with the launcher's environment and agreed
    assert result.library_authority.startswith("this host's loader (/lib64/ld-linux-x86-64.so.2 --list")
    assert (
        "libnuma.so.1" in result.host_libraries and "/libnuma.so.1 (" in result.host_libraries["libnuma.so.1"]
    )
    assert result.vllm_version == "0.32.0"
    kept = (tree / surface.RECORD).read_text()
    assert kept == (REPO / "src" / "rocmdoctor" / "vllm" / "surfaces" / "0.32.0.json").read_text()
    (prefix / "current").symlink_to(tree.name)
    asked = ask_vllm.for_prefix(prefix)
    assert asked.asked and asked.version == "0.32.0"
