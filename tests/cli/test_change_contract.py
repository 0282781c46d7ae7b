"""Every command that changes a host, under --check --json: nothing written (the tree byte-identical,
links and modes included), the one change envelope (src/rocmdoctor/schema/change.schema.json), and
`changed`/`diff` right in both directions: "would change" before, converged after the real run. For
people, the same --check ends in the one rendering of a Change (rendering/change_text.py): the
envelope's message, then `changed=`.

Below: every command that has --check, read from the CLI's command tree, writes nothing, signals nothing,
runs nothing that changes a host and sends no mutating request under --check (an audit hook watches)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from conftest import FIXTURES
from harness.cli import rocmdoctor
from harness.hosts import fixture_root, two_instance_layout
from harness.trees import account_root, tree_state
from rocmdoctor.report import load_schema

CHANGE = jsonschema.Draft202012Validator(load_schema("change.schema.json"))
T1, T2 = "vllm0.1.0-rocm7.0.0-gfx1151", "vllm0.2.0-rocm7.0.0-gfx1151"


def envelope_of(done: Any) -> dict[str, Any]:
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    CHANGE.validate(doc)
    return doc


def assert_rendered(done: Any, doc: dict[str, Any]) -> None:
    """The people-facing output of a --check: the envelope's message and `changed=` close it."""
    assert done.returncode == 0, done.stdout + done.stderr
    closing = f"{doc['msg']}\nchanged={str(doc['changed']).lower()}"
    assert done.stdout.rstrip("\n").endswith(closing), done.stdout


def assert_contract(watched: Path, run: Callable[..., Any], apply: tuple[str, ...] = ()) -> None:
    """--check first (would change, writes nothing), the real run (`apply`: the flag that makes a
    command write rather than show), then --check again (converged)."""
    before = tree_state(watched)
    planned = envelope_of(run("--check", "--json"))
    assert tree_state(watched) == before, "a --check run wrote"
    assert planned["check"] is True and planned["changed"] is True and planned["diff"], planned
    assert_rendered(run("--check"), planned)
    assert tree_state(watched) == before, "a --check run wrote"
    done = envelope_of(run(*apply, "--json"))
    assert done["check"] is False and done["changed"] is True, done
    after = tree_state(watched)
    again = envelope_of(run("--check", "--json"))
    assert again["changed"] is False and tree_state(watched) == after, again
    assert_rendered(run("--check"), again)
    assert envelope_of(run(*apply, "--json"))["changed"] is False


def test_unit(tmp_path: Path):
    root = account_root(tmp_path)
    model = ("--model", "/srv/models/tiny", "--gpu-memory-utilization", "0.8", "--", "--enforce-eager")
    assert_contract(
        root,
        lambda *flags: rocmdoctor("unit", *flags, "--target", str(root), *model, root=root),
        ("--write",),
    )


def test_instances(tmp_path: Path):
    root = account_root(tmp_path)
    layout = (*two_instance_layout(), "--model", "/srv/models/tiny", "--port", "18000")
    assert_contract(
        root,
        lambda *flags: rocmdoctor("instances", *flags, "--target", str(root), *layout, root=root),
        ("--write",),
    )


def test_lock_install_rollback_and_prune(install_lab):
    lab = install_lab
    built = {tag: lab.bundle(tag) for tag in (T1, T2)}
    lab.pin("gfx1151", built[T1])  # the release server's newest is T2: a refresh moves the pin
    prefix = ("--prefix", str(lab.prefix))
    pins = ("--bundles-dir", str(lab.pins), "--family", "gfx1151", "--connect-timeout", "2")
    assert_contract(lab.root, lambda *flags: lab.cli("bundle", "lock", *prefix, *pins, *flags))
    lab.pin("gfx1151", built[T1])
    lab.prefix.mkdir()
    assert_contract(lab.root, lambda *flags: lab.install("gfx1151", *flags))
    lab.pin("gfx1151", built[T2])
    assert_contract(lab.root, lambda *flags: lab.install("gfx1151", *flags))
    assert_contract(lab.root, lambda *flags: lab.cli("rollback", *prefix, "--to", T1, *flags))
    assert_contract(lab.root, lambda *flags: lab.cli("bundle", "prune", *prefix, "--keep", "1", *flags))


@pytest.mark.parametrize("command", ["unit", "instances"])
def test_check_alone_needs_no_write_flag_and_says_so_in_text(tmp_path: Path, command: str):
    root = account_root(tmp_path)
    args = ("--model", "/srv/models/tiny") + (
        ("--gpu-memory-utilization", "0.8") if command == "unit" else tuple(two_instance_layout())
    )
    before = tree_state(root)
    done = rocmdoctor(command, "--check", "--target", str(root), *args, root=root)
    assert done.returncode == 0, done.stderr
    assert "would change" in done.stdout and "changed=true" in done.stdout
    assert tree_state(root) == before


def test_jit_cache_purge(tmp_path: Path):
    jit = tmp_path / "state/jit"
    for name in ("gfx1151-00aa", "gfx1151-11bb"):
        (jit / name / "triton").mkdir(parents=True)
        (jit / name / "triton" / "kernel.so").write_bytes(b"\x7fELF")
    args = (
        "bundle",
        "cache",
        "purge",
        "--prefix",
        str(tmp_path / "opt"),
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert_contract(tmp_path, lambda *flags: rocmdoctor(*args, *flags))
    assert list(jit.iterdir()) == []  # no current bundle: every cache was another bundle's


# -- every --check, from the CLI itself ----------------------------------------------------------------
#
# The commands that have --check are read from click's command tree (an alias such as `bundle install`
# is its own path). Each runs under --check with an audit hook on: no file may be opened for writing,
# renamed, removed, made, linked or re-moded, no signal sent (os.kill/killpg, pidfd_send_signal), no
# program run that changes a host, and no request but GET reach the stand-in servers.

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
CHANGING_EVENTS = {
    "os.rename", "os.remove", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.chmod", "os.chown",
    "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile", "os.kill", "os.killpg",
}  # fmt: skip
# Programs a dry run may run: they read (the bundle's interpreter answering a version, `systemctl show`).
READING_PROGRAMS = {"systemctl": {"show", "cat", "is-active", "is-enabled", "status", "--version"}}
_watch: dict[str, list[str] | None] = {"events": None}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    events = _watch["events"]
    if events is None:
        return
    if event == "open":
        path, mode, flags = (args + (None, None))[:3]
        writes = (isinstance(mode, str) and set(mode) & set("wax+")) or (
            isinstance(flags, int) and flags & WRITE_FLAGS
        )
        if writes and not str(path).endswith(".pyc") and "__pycache__" not in str(path):
            events.append(f"open {path} for writing")
    elif event in CHANGING_EVENTS:
        events.append(f"{event} {args[:2]}")
    elif event == "subprocess.Popen":
        argv = [str(a) for a in (args[1] or [])]
        verbs = READING_PROGRAMS.get(Path(argv[0]).name if argv else "")
        if verbs is None or not set(argv[1:2]) <= verbs:
            events.append(f"runs {argv}")


sys.addaudithook(_audit)


def watched_check(run: Callable[[], Any], monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[str]]:
    """`run()` (a --check), and every write, signal or changing program it made."""
    import signal

    sent: list[str] = []
    real = getattr(signal, "pidfd_send_signal", None)
    if real is not None:

        def recorded(fd: int, sig: int, *rest: Any) -> None:
            sent.append(f"pidfd_send_signal {sig}")
            real(fd, sig, *rest)

        monkeypatch.setattr(signal, "pidfd_send_signal", recorded)
    _watch["events"] = events = []
    try:
        done = run()
    finally:
        _watch["events"] = None
    return done, events + sent


def mutating(request: dict[str, Any]) -> bool:
    """A request that may change the server: anything but GET, except Lemonade's documented dry run
    (a POST of options with `dry_run: true` validates and saves nothing [API "Per-model options"])."""
    body = request.get("body")
    return request["method"] != "GET" and not (isinstance(body, dict) and body.get("dry_run") is True)


def check_paths() -> list[str]:
    """Every command path that takes --check, from the CLI's own command tree."""
    import click

    from rocmdoctor.cli import cli

    found = []

    def walk(command: click.Command, path: list[str], ctx: click.Context) -> None:
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, [*path, name], click.Context(sub, parent=ctx))
        elif any(isinstance(p, click.Option) and "--check" in p.opts for p in command.params):
            found.append(" ".join(path))

    walk(cli, [], click.Context(cli))
    return sorted(found)


class CheckCase:
    """One --check run: the argv after the command path, the tree it must leave alone, the Lemonade
    stand-in's request log (no request but GET), and what the run must say."""

    def __init__(self, argv: list[str], watched: Path, root: Path | None = None, **kw: Any) -> None:
        self.argv, self.watched, self.root = argv, watched, root
        self.env: dict[str, str] = kw.get("env", {})
        self.requests: list[dict[str, Any]] | None = kw.get("requests")
        self.says: str = kw.get("says", "would")


def _install_case(lab: Any, path: str) -> CheckCase:
    """A lab with T1 and T2 installed (T2 current), pins moved to T1: each bundle command would change."""
    built = {tag: lab.bundle(tag) for tag in (T1, T2)}
    for tag in (T1, T2):
        lab.pin("gfx1151", built[tag])
        assert lab.install("gfx1151").returncode == 0
    (lab.root / "jit/gfx1151-00aa/triton").mkdir(parents=True)
    prefix = ["--prefix", str(lab.prefix)]
    pins = ["--bundles-dir", str(lab.pins), "--family", "gfx1151", "--connect-timeout", "2"]
    env = {"ROCMDOCTOR_GITHUB_API": lab.server.api_url}
    lab.pin("gfx1151", built[T1])
    argv = {
        "install": ["--family", "gfx1151", "--force", *prefix, "--bundles-dir", str(lab.pins)],
        "rollback": [*prefix],
        "bundle prune": [*prefix, "--keep", "1"],
        "bundle lock": [*prefix, *pins[:2], "--family", "gfx1151"],
        "bundle fetch": ["--to", str(lab.root / "mirror"), "--bundles-dir", str(lab.pins)],
        "bundle cache purge": [*prefix, "--state-dir", str(lab.root)],
        # back onto T1 with one instance (a closed port: --check asks no server anything)
        "upgrade": [
            "--tag",
            T1,
            *prefix,
            "--bundles-dir",
            str(lab.pins),
            "--unit",
            "vllm@0=http://127.0.0.1:9",
        ],
    }[path.replace("bundle install", "install").replace("bundle rollback", "rollback")]
    lab.server.add_release("lemonade-sdk/vllm-rocm", "vllm0.3.0-rocm7.0.0-gfx1151", [])  # lock would move
    return CheckCase(argv, lab.root, env=env)


def _lemonade_case(tmp_path: Path, path: str, stack: contextlib.ExitStack) -> CheckCase:
    from harness.lemonade_server import Registered, State, lemonade_server, make_report_host, qwen3_8b_cache

    host = make_report_host(tmp_path / "host")
    hub = qwen3_8b_cache(tmp_path / "hub")
    (tmp_path / "lemonade-state").mkdir()
    models = {"user.Qwen3-8B-vLLM": Registered("Qwen/Qwen3-8B")}
    state = State(tmp_path / "lemonade-state", models=models, backend_state="installable")
    server = stack.enter_context(lemonade_server(state))
    env = {"LEMONADE_ADMIN_API_KEY": "", "LEMONADE_API_KEY": "", "HF_HUB_CACHE": str(hub)}
    argv = ["--url", server.url] + (["--model", "user.Qwen3-8B-vLLM"] if path.endswith("apply") else [])
    return CheckCase(argv, tmp_path, root=host, env=env, requests=state.requests)


def _tune_case(tmp_path: Path) -> CheckCase:
    from harness.hosts import run_cli
    from rocmdoctor.provision.tune.state import KIND, context_key

    server = tmp_path / "opt/current/bin/vllm-server"  # fails loudly if anything starts it
    server.parent.mkdir(parents=True)
    server.write_text("#!/bin/sh\nexit 97\n")
    server.chmod(0o755)
    target, state = tmp_path / "target", tmp_path / "state.json"
    target.mkdir()
    model = str(FIXTURES / "model_configs" / "qwen3-8b")
    common = ["--gpu-memory-utilization", "0.5", "--max-model-len", "512", "--prefix", str(tmp_path / "opt")]
    assert rocmdoctor("unit", "--write", "--target", str(target), "--model", model, *common).returncode == 0
    argv = ["--model", model, *common, "--kv-cache-memory", "2GiB", "--seqs", "1,2", "--json",
            "--state-file", str(state), "--target", str(target)]  # fmt: skip
    root = fixture_root("no-amd-gpu")
    plan = json.loads(run_cli("tune", *argv, "--plan-only", root=root).stdout)["plan"]
    points = [
        {"max_num_seqs": n, "output_tokens_per_s": t, "requests": 16,
         "latency_ms": {"ttft": {"p50": 140.0, "p95": 150.0, "p99": 155.0}}}
        for n, t in ((1, 450.0), (2, 840.0))
    ]  # fmt: skip
    entries = {context_key(plan["context"]): {"context": plan["context"], "points": points}}
    state.write_text(json.dumps({"schema_version": 1, "kind": KIND, "entries": entries}))
    return CheckCase(argv, tmp_path, root=root)


def check_case(path: str, tmp_path: Path, lab: Any, stack: contextlib.ExitStack) -> CheckCase:
    if path in ("unit", "instances", "cluster unit"):
        root = account_root(tmp_path)
        argv = {
            "unit": ["--model", "/srv/models/tiny", "--gpu-memory-utilization", "0.8"],
            "instances": [*two_instance_layout(), "--model", "/srv/models/tiny", "--port", "18000"],
            "cluster unit": ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                             "--advertise", "10.0.0.2", "--model", "/srv/models/tiny",
                             "--gpu-memory-utilization", "0.8"],
        }[path]  # fmt: skip
        return CheckCase([*argv, "--target", str(root)], root, root=root)
    if path == "fix":
        root = tmp_path / "host"
        shutil.copytree(fixture_root("strix-halo-default-ttm"), root, symlinks=True)
        return CheckCase(["--target", str(root), "--user", "vllm"], root, root=root)
    if path.startswith("lemonade"):
        return _lemonade_case(tmp_path, path, stack)
    if path == "tune":
        return _tune_case(tmp_path)
    return _install_case(lab, path)


KNOWN = sorted(
    ["bundle cache purge", "bundle fetch", "bundle install", "bundle lock", "bundle prune", "bundle rollback",
     "cluster unit", "fix", "install", "instances", "lemonade apply", "lemonade install-backend", "rollback",
     "tune", "unit", "upgrade"]
)  # fmt: skip


def test_the_check_commands_are_read_from_the_cli():
    """A new command with --check joins the contract below (its case in `check_case`) or this fails."""
    assert check_paths() == KNOWN


@pytest.mark.parametrize("path", KNOWN)
def test_every_check_writes_signals_and_sends_nothing(path, tmp_path, install_lab, monkeypatch):
    with contextlib.ExitStack() as stack:
        case = check_case(path, tmp_path, install_lab, stack)
        before = tree_state(case.watched)
        asked = len(case.requests) if case.requests is not None else 0
        done, effects = watched_check(
            lambda: rocmdoctor(*path.split(), "--check", *case.argv, root=case.root, env=case.env),
            monkeypatch,
        )
        after = tree_state(case.watched)
        sent = [] if case.requests is None else [r for r in case.requests[asked:] if mutating(r)]
    assert done.returncode == 0, done.stdout + done.stderr
    assert case.says in done.stdout, done.stdout
    assert effects == [], f"{path} --check: {effects}"
    assert after == before, f"{path} --check changed its tree"
    assert sent == [], f"{path} --check sent {sent}"


def test_the_watch_sees_what_a_real_run_does(tmp_path, monkeypatch):
    """The audit above could pass by seeing nothing: the same unit without --check is seen writing."""
    root = account_root(tmp_path)
    argv = ["unit", "--write", "--model", "/srv/models/tiny", "--gpu-memory-utilization", "0.8"]
    done, effects = watched_check(lambda: rocmdoctor(*argv, "--target", str(root), root=root), monkeypatch)
    assert done.returncode == 0, done.stderr
    assert any(e.startswith("open ") and "vllm.service" in e for e in effects), effects
