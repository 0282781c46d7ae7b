"""Hostile server arguments, prefixes and --root trees: each refused with a clear message, nothing written.

vLLM's parser takes any unambiguous prefix of a flag (`--api-ke`, `--por`), `--flag=value`, `_` for `-`,
dotted JSON keys and short aliases; every spelling of a refused or computed flag must be caught, or the
key lands in ExecStart and the computed port is silently overridden.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import REPO
from harness.cli import rocmdoctor as run_in_process
from harness.engine import require_vllm_python
from rocmdoctor.provision.server.args import ArgumentError, Choices, GpuPool, flag_meanings, resolve
from rocmdoctor.vllm.flags import FLAGS, VLLM_VERSION

POOLS = [GpuPool("gpu0", "gfx11", 24 << 30, 23 << 30, False)]


def rocmdoctor(
    *argv: str, root: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return run_in_process(*argv, root=root, env=env)


# word(s) after `--` -> what the refusal names
REFUSED_SPELLINGS = [
    (["--api-key", "SECRET"], "--api-key-file"),
    (["--api-ke", "SECRET"], "--api-key-file"),
    (["--api-k=SECRET"], "--api-key-file"),
    (["--api_key", "SECRET"], "--api-key-file"),
    (["--api", "SECRET"], "--api-key-file"),  # ambiguous for vLLM, and one meaning is the key
    (["--hf-tok", "hf_SECRET"], "HF_TOKEN"),
    (["--confi", "x.yaml"], "config file"),
    (["--uds", "/run/v.sock"], "Unix socket"),
    (["-h"], "--help"),
    (["--por", "9999"], "computed by rocmdoctor"),
    (["--port=9999"], "computed by rocmdoctor"),
    (["--port.x", "1"], "computed by rocmdoctor"),
    (["--gpu-memory-util", "0.99"], "--gpu-memory-utilization"),
    (["--gpu_memory_utilization=0.99"], "--gpu-memory-utilization"),
    (["-tp", "2"], "--tensor-parallel-size"),
    (["-t", "2"], "--tensor-parallel-size"),
    (["-tp=2"], "--tensor-parallel-size"),
    (["--max-num-s", "4"], "--max-num-seqs"),
    (["--max_model_len=4"], "--max-model-len"),
    (["--served-model", "x"], "--served-model-name"),
    (["--mod", "other/model"], "--model"),
    (["--hos", "0.0.0.0"], "--host"),
    (["--enforce-eager", "other/model"], "would read it as the model"),
    (["--enforce-eager", "--", "--port", "1"], "second `--`"),
]


@pytest.mark.parametrize(("extra", "named"), REFUSED_SPELLINGS)
def test_every_spelling_of_a_refused_or_computed_flag_is_refused(extra, named):
    with pytest.raises(ArgumentError) as refused:
        resolve(Choices(model="m", extra=extra), POOLS)
    assert named in str(refused.value)
    assert "SECRET" not in str(refused.value), "a refusal must not echo the secret"


ACCEPTED = [
    ["--enforce-eager", "--dtype", "bfloat16"],
    ["--dtype=half", "--seed", "-1"],
    ["--chat-template", "{{ $x }} with spaces", "--enforce-eager"],
    ["-qfp8"],
    ["-q", "fp8"],
    ["-O3"],
    ["--compilation-config.level", "3"],
    ["--max-num-batched-tokens", "8192"],
    ["--kv-cache-memory-bytes", "4G"],
    ["--no-enable-prefix-caching"],
    ["--lora-modules", "a=/x", "b=/y"],
]


@pytest.mark.parametrize("extra", ACCEPTED)
def test_ordinary_vllm_arguments_pass_unchanged(extra):
    args = resolve(Choices(model="m", gpu_memory_utilization=0.5, extra=extra), POOLS)
    assert args.argv()[-len(extra) :] == extra
    assert args.value("--port") == "8000"


def test_an_unknown_flag_passes_with_a_note():
    args = resolve(Choices(model="m", gpu_memory_utilization=0.5, extra=["--brand-new-flag", "1"]), POOLS)
    assert args.extra == ["--brand-new-flag", "1"]
    assert any("--brand-new-flag is not a flag of vLLM" in note for note in args.notes)


def test_flag_meanings_follow_argparse_abbreviation():
    assert flag_meanings("--api-ke") == {"--api-key"}
    assert flag_meanings("--por") == {"--port"}
    assert flag_meanings("-tp") == {"--tensor-parallel-size"}
    assert flag_meanings("-qfp8") == {"--quantization"}
    assert flag_meanings("-O3") == {"--optimization-level"}
    assert flag_meanings("--max_num_seqs=4") == {"--max-num-seqs"}
    assert len(flag_meanings("--p")) > 1  # ambiguous: vLLM refuses it
    assert flag_meanings("bfloat16") == set() and flag_meanings("-1") == set()


def test_the_flag_list_is_the_newest_shipped_surface_table():
    """One source: vllm/flags.py narrows the shipped table of the newest vLLM (surfaces/0.32.0.json, which
    tests/system/test_vllm_versions.py compares with that vLLM's own parser) instead of repeating it."""
    table = json.loads((REPO / "src/rocmdoctor/vllm/surfaces" / f"{VLLM_VERSION}.json").read_text())
    assert VLLM_VERSION == table["vllm_version"] == "0.32.0"
    assert {option: (row[0], row[1]) for option, row in table["flags"].items()} == FLAGS
    assert FLAGS["-tp"] == ("--tensor-parallel-size", 1) and FLAGS["--api-key"] == ("--api-key", -1)


@pytest.mark.system  # imports the installed vLLM
def test_vllm_parser_really_takes_the_abbreviations_we_refuse():
    """The premise, checked against vLLM's own parser: --api-ke and --por are accepted abbreviations."""
    python = require_vllm_python()
    code = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "a = make_arg_parser(FlexibleArgumentParser()).parse_args(['--api-ke', 'K', '--por', '9999', "
        "'--gpu-memory-util', '0.5', '-t', '1'])\n"
        "print(a.api_key, a.port, a.gpu_memory_utilization, a.tensor_parallel_size)\n"
    )
    done = subprocess.run(
        [str(python), "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=200,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-4:] == ["['K']", "9999", "0.5", "1"]


# -- the command line: what is rocmdoctor's, what is vLLM's ---------------------------------------------

UNIT = ("unit", "--model", "m", "--gpu-memory-utilization", "0.8")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--layoutz", "per-gpu"), "rocmdoctor unit does not know it"),
        (("--enforce-eager",), "--enforce-eager is vLLM's, and vLLM's own arguments go after `--`"),
        (("stray",), "unexpected extra argument"),
        (("--", "--api-ke", "SECRET"), "--api-key-file"),
        (("--", "--por", "9999"), "computed by rocmdoctor"),
        (("--vllm-args", "--gpu-memory-util 0.99"), "computed by rocmdoctor"),
    ],
)
def test_unit_never_hands_an_unknown_option_to_vllm(argv, message):
    done = rocmdoctor(*UNIT, *argv)
    assert done.returncode == 2, done.stdout
    assert message in done.stderr and "Traceback" not in done.stderr
    assert "SECRET" not in done.stdout + done.stderr


def test_vllm_arguments_after_the_double_dash_reach_exec_start():
    done = rocmdoctor(*UNIT, "--", "--enforce-eager", "--dtype", "half")
    assert done.returncode == 0, done.stderr
    exec_start = next(line for line in done.stdout.splitlines() if line.startswith("ExecStart="))
    assert exec_start.endswith("--enforce-eager --dtype half")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--model=-h",), "starts with '-'"),
        (("--model", "--help-me"), "starts with '-'"),
        (("--served-model-name", "-x"), "starts with '-'"),
        (("--user", "nobody"), "nobody"),
        (("--user", "root"), "root"),
        (("--host", "a b"), "not an IP address or a host name"),
        (("--port", "99999"), "1 to 65535"),
        (("--port", "-1"), "1 to 65535"),
        (("--gpu-memory-utilization", "0.004"), "0.01 to 1"),
        (("--gpu-memory-utilization", "nan"), "0.01 to 1"),
        (("--timeout", "-5"), "whole seconds in (0,"),
        (("--timeout", "1e30"), "whole seconds in (0,"),
        (("--timeout", "nan"), "whole seconds in (0,"),
        (("--timeout", "0"), "whole seconds in (0,"),
        (("--max-model-len", "0"), "from 1 to"),
    ],
)
def test_unit_values_are_checked_at_the_edge(argv, message):
    base = ["unit", "--model", "m", "--gpu-memory-utilization", "0.8"]
    done = rocmdoctor(*base, *argv)
    assert done.returncode == 2, done.stdout
    assert message in done.stderr and "Traceback" not in done.stderr
    assert "Invalid value for" in done.stderr or "--user" in done.stderr


PREFIXES = [
    ("+/opt/rd", "ExecStart= modifier"),
    ("-/opt/rd", "ExecStart= modifier"),
    ("@/opt/rd", "ExecStart= modifier"),
    ("!/opt/rd", "ExecStart= modifier"),
    (":/opt/rd", "ExecStart= modifier"),
    ("opt/rd", "relative"),
    ("", "empty"),
    ("/", "is / itself"),
    ("/opt/../etc", "'..'"),
    ("/opt/r d", "whitespace"),
    ("/opt/rd\nExecStartPre=/bin/sh", "control characters"),
]
PREFIX_COMMANDS = [
    ("unit", "--model", "m", "--gpu-memory-utilization", "0.8"),
    ("serve", "--model", "m", "--gpu-memory-utilization", "0.8"),
    ("check",),
    ("bundles",),
    ("rollback",),
    ("install", "--family", "gfx1151"),
]


@pytest.mark.parametrize(("prefix", "message"), PREFIXES)
def test_a_bad_prefix_is_refused(prefix, message):
    done = rocmdoctor(*UNIT, "--prefix", prefix)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--prefix" in done.stderr and message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", PREFIX_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("prefix", ["+/opt/rd", ""])
def test_every_command_refuses_a_bad_prefix_from_the_option_and_the_environment(command, prefix):
    done = rocmdoctor(*command, "--prefix", prefix)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--prefix" in done.stderr and "Traceback" not in done.stderr
    via_env = rocmdoctor(*command, env={"ROCMDOCTOR_PREFIX": prefix})
    assert via_env.returncode == 2, via_env.stdout + via_env.stderr
    assert "ROCMDOCTOR_PREFIX" in via_env.stderr or "--prefix" in via_env.stderr


def test_a_trailing_slash_is_normalised_not_refused(tmp_path):
    done = rocmdoctor(*UNIT, "--prefix", "/srv/rd//")
    assert done.returncode == 0, done.stderr
    assert "ExecStart=/srv/rd/current/bin/vllm-server " in done.stdout


# -- unit --write --root: nothing from the tree runs, no link is followed out of it ---------------------


def hostile_root(tmp_path: Path) -> Path:
    """A root whose useradd/groupadd would be run by `useradd --root` (they leave a marker) and whose
    unit path is a link to a file outside it."""
    root = tmp_path / "root"
    for sub in ("etc/systemd/system", "usr/sbin", "sbin"):
        (root / sub).mkdir(parents=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "etc/group").write_text("root:x:0:\nvideo:x:44:\n")
    (root / "etc/shadow").write_text("root:*:20000:0:99999:7:::\n")
    (root / "etc/shadow").chmod(0o640)
    marker = tmp_path / "executed"
    for tool in ("usr/sbin/useradd", "usr/sbin/groupadd", "sbin/useradd", "sbin/groupadd"):
        (root / tool).write_text(f"#!/bin/sh\ntouch {marker}\n")
        (root / tool).chmod(0o755)
    return root


def test_write_into_a_foreign_root_runs_nothing_from_it_and_edits_the_account_files(tmp_path):
    root = hostile_root(tmp_path)
    done = rocmdoctor(*UNIT, "--write", "--target", str(root), "--json", root=root)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "executed").exists(), "a program from inside --root was executed"
    assert set(json.loads(done.stdout)["accounts_created"]) == {"group render", "user vllm"}
    passwd = (root / "etc/passwd").read_text().splitlines()
    user = next(line for line in passwd if line.startswith("vllm:")).split(":")
    uid, gid = int(user[2]), int(user[3])
    assert 100 <= uid <= 999 and user[5:] == ["/var/lib/vllm", "/usr/sbin/nologin"]
    groups = {line.split(":")[0]: line.split(":") for line in (root / "etc/group").read_text().splitlines()}
    assert int(groups["vllm"][2]) == gid and "render" in groups and groups["video"][2] == "44"
    assert any(line.startswith("vllm:!:") for line in (root / "etc/shadow").read_text().splitlines())
    assert oct((root / "etc/shadow").stat().st_mode & 0o777) == "0o640"
    again = rocmdoctor(*UNIT, "--write", "--target", str(root), "--json", root=root)
    assert json.loads(again.stdout)["changed"] is False


def test_a_link_out_of_the_root_is_never_read_or_written(tmp_path):
    root = hostile_root(tmp_path)
    outside = tmp_path / "victim"
    outside.write_text("secret: do not show\n")
    (root / "etc/systemd/system/vllm.service").symlink_to(outside)
    done = rocmdoctor(*UNIT, "--write", "--target", str(root), root=root)
    assert done.returncode == 2 and "refusing to follow it" in done.stderr
    assert "do not show" not in done.stdout + done.stderr
    assert outside.read_text() == "secret: do not show\n"


def test_a_linked_directory_in_the_root_is_not_followed(tmp_path):
    root = hostile_root(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "opt").symlink_to(elsewhere)
    done = rocmdoctor(*UNIT, "--write", "--target", str(root), root=root)
    assert done.returncode == 2 and "refusing to follow it" in done.stderr
    assert list(elsewhere.iterdir()) == []


def test_an_existing_uid_0_account_is_refused(tmp_path):
    root = hostile_root(tmp_path)
    with (root / "etc/passwd").open("a") as passwd:
        passwd.write("toor:x:0:0::/root:/bin/sh\n")
    done = rocmdoctor(*UNIT, "--write", "--target", str(root), "--user", "toor", root=root)
    assert done.returncode == 2 and "uid 0" in done.stderr
    assert not (root / "etc/systemd/system/vllm.service").exists()


# -- flag_meanings against argparse itself ---------------------------------------------------------------


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise _Refused(message)


def stdlib_parser() -> _Parser:
    """argparse with vLLM's flag list (allow_abbrev as vLLM has it): what the shipped data says it parses."""
    parser = _Parser(add_help=False, allow_abbrev=True)
    by_action: dict[str, list[str]] = {}
    for option, (canonical, _) in FLAGS.items():
        by_action.setdefault(canonical, []).append(option)
    for canonical, options in by_action.items():
        takes = FLAGS[canonical][1]
        kwargs: dict = {"action": "store_true"} if takes == 0 else {"nargs": "?", "const": "c"}
        parser.add_argument(*sorted(options, key=len, reverse=True), dest=canonical, default=None, **kwargs)
    return parser


PARSER = stdlib_parser()


@settings(max_examples=400, deadline=None)
@given(
    option=st.sampled_from(sorted(FLAGS)),
    cut=st.integers(min_value=2, max_value=40),
    value=st.sampled_from(["", "=1"]),
)
def test_flag_meanings_agree_with_argparse_on_every_prefix(option, cut, value):
    token = option[:cut] + value
    try:
        namespace, rest = PARSER.parse_known_args([token])
    except _Refused as refused:
        if "ambiguous" in str(refused):
            assert len(flag_meanings(token)) > 1, token
        return
    chosen = {dest for dest, got in vars(namespace).items() if got is not None}
    if chosen:
        assert flag_meanings(token) == chosen, token
    else:
        assert rest == [token] and not flag_meanings(token) - {"--optimization-level"}, token
