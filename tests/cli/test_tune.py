"""`rocmdoctor tune` before any server: the plan on host fixtures (APUs: never above the free-memory
rule), and every refusal of bad input (exit 2, a message that says what to do, no traceback)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import jsonschema
import pytest

from conftest import FIXTURES
from harness.hosts import fixture_root, run_cli
from harness.trees import tree_state
from rocmdoctor.checks import facts
from rocmdoctor.commands.host_pools import pools_from_facts
from rocmdoctor.host import Host
from rocmdoctor.registry import Context, Options
from rocmdoctor.report import load_schema
from rocmdoctor.vllm.memory_rule import recommended

CHANGE = jsonschema.Draft202012Validator(load_schema("change.schema.json"))

# The APU captures whose pool the runtime reports with its use (tests/cli/test_server_args_hosts.py).
APUS = ("strix-halo-clean", "strix-halo-nocwsr-dkms", "strix-halo-default-ttm")


def header_only_model(tmp_path, fixture: str, parameters: int) -> str:
    """A real config with a header-only bf16 safetensors file of the model's size (the plan reads headers)."""
    model = tmp_path / fixture
    model.mkdir()
    shutil.copy(FIXTURES / "model_configs" / fixture / "config.json", model / "config.json")
    rows = parameters // 4096
    header = {"w": {"dtype": "BF16", "shape": [rows, 4096], "data_offsets": [0, rows * 4096 * 2]}}
    blob = json.dumps(header).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob)
    return str(model)


def plan_of(done) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["plan"]


@pytest.mark.parametrize("fixture_id", APUS)
def test_on_an_apu_tune_never_asks_more_than_the_free_memory_rule(tmp_path, fixture_id):
    model = header_only_model(tmp_path, "qwen3-8b", 8_190_735_360)
    plan = plan_of(run_cli("tune", "--model", model, "--plan-only", "--json", root=fixture_root(fixture_id)))
    (pool,) = pools_from_facts(Context(Host(fixture_root(fixture_id)), Options()))
    assert pool.unified and pool.total and pool.free is not None
    rule = recommended(pool.total, pool.free)
    assert 0 < float(plan["gpu_memory_utilization"]) <= rule
    argv = plan["server_argv"]
    assert argv[argv.index("--gpu-memory-utilization") + 1] == plan["gpu_memory_utilization"]
    assert "--max-num-seqs" not in argv  # tune sets it per trial
    assert plan["seqs"][0] == 1 and plan["seqs"][-1] <= plan["kv_requests"]
    # Asked for more than the rule allows now, tune refuses before any start: one start over the
    # rule on a unified-memory APU can take the host down.
    over = f"{min(1.0, rule + 0.05):.2f}"
    refused = run_cli(
        "tune",
        "--model",
        model,
        "--gpu-memory-utilization",
        over,
        "--plan-only",
        root=fixture_root(fixture_id),
    )
    assert (
        refused.returncode == 2 and "free-memory rule" in refused.stderr and "Traceback" not in refused.stderr
    )


def test_an_apu_fixture_is_what_the_rule_test_reads():
    gpus = facts.gpus(Context(Host(fixture_root("strix-halo-clean")), Options()))
    assert any(g.apu for g in gpus)


def test_a_model_the_plan_says_does_not_fit_is_refused_with_what_to_do(tmp_path):
    model = header_only_model(tmp_path, "llama-3.1-8b-instruct", 8_030_261_248)
    done = run_cli("tune", "--model", model, "--plan-only", root=fixture_root("strix-point"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "cannot start here" in done.stderr and "rocmdoctor plan" in done.stderr


CPU = ("--gpu-memory-utilization", "0.5", "--plan-only")


def cpu_tune(*args: str, model: str | None = None):
    model = model or str(FIXTURES / "model_configs" / "qwen3-8b")
    return run_cli("tune", "--model", model, *CPU, *args, root=fixture_root("no-amd-gpu"))


def test_without_a_gpu_the_plan_needs_the_kv_cache_size():
    done = cpu_tune()
    assert done.returncode == 2 and "--kv-cache-memory" in done.stderr
    planned = plan_of(cpu_tune("--kv-cache-memory", "8GiB", "--json"))
    assert planned["kv_cache_tokens"] > 0 and planned["workload"]["source"] == "synthetic"
    small = cpu_tune("--kv-cache-memory", "1KiB")
    assert small.returncode == 2 and "does not fit" in small.stderr and "Try:" in small.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--slo", "ttft<2s"), "METRIC:pPCT<=LIMIT"),
        (("--slo", "ttft:p95<=0ms"), "must be positive"),
        (("--slo", ""), "METRIC:pPCT<=LIMIT"),  # issue 35: an empty limit was taken as no limit
        (("--margin", "0.9"), "0.9 is not in the range"),
        (("--confirm", "11"), "--confirm"),
        (("--seqs", "0:8"), "LOW:HIGH"),
        (("--seqs", "a,b"), "LOW:HIGH"),
        (("--seqs", "1:99999"), "LOW:HIGH"),
        (("--write", "--check"), "give one"),
        (("--instance", "2", "--lemonade-model", "m"), "give one"),
        (("--plot", "out.gif"), ".png or .svg"),
    ],
)
def test_bad_options_are_refused_with_the_form(args, message):
    done = cpu_tune("--kv-cache-memory", "8GiB", *args)
    assert done.returncode == 2, done.stdout
    assert message in done.stderr and "Traceback" not in done.stderr


def test_seqs_beyond_what_the_kv_cache_holds_are_refused():
    done = cpu_tune("--kv-cache-memory", "2GiB", "--max-model-len", "512", "--seqs", "1,4096")
    assert done.returncode == 2 and "the KV cache holds" in done.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"prompt": "a", "output_tokens": 2}\n{"prompt": "b"}\n', "line 2"),
        (b"[1, 2]\n", "line 1"),
        (b"", "no requests"),
    ],
)
def test_a_bad_workload_file_is_refused_naming_the_line(tmp_path, content, message):
    workload = tmp_path / "jobs.jsonl"
    workload.write_bytes(content)
    done = cpu_tune("--kv-cache-memory", "8GiB", "--workload", str(workload))
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_a_workload_that_is_not_a_regular_file_is_refused(tmp_path):
    done = cpu_tune("--kv-cache-memory", "8GiB", "--workload", "/dev/zero")
    assert done.returncode == 2 and "not a regular file" in done.stderr
    missing = cpu_tune("--kv-cache-memory", "8GiB", "--workload", str(tmp_path / "none.jsonl"))
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_the_workload_sets_the_typical_length_the_plan_bounds_the_search_with(tmp_path):
    workload = tmp_path / "jobs.jsonl"
    workload.write_text(
        "".join(json.dumps({"prompt": "w" * 400, "output_tokens": 28}) + "\n" for _ in range(3))
    )
    planned = plan_of(
        cpu_tune("--kv-cache-memory", "2GiB", "--max-model-len", "512", "--workload", str(workload), "--json")
    )
    assert planned["workload"]["typical_len"] == 128 and planned["workload"]["requests_in_file"] == 3
    assert planned["kv_requests"] == planned["kv_cache_tokens"] // 128
    assert planned["seqs"][-1] == min(planned["kv_requests"], 4096)


def test_without_an_installed_bundle_tune_says_to_install_one(tmp_path):
    done = run_cli(
        "tune", "--model", str(FIXTURES / "model_configs" / "qwen3-8b"), "--gpu-memory-utilization", "0.5",
        "--kv-cache-memory", "8GiB", "--prefix", str(tmp_path / "opt"), root=fixture_root("no-amd-gpu"),
    )  # fmt: skip
    assert done.returncode == 2 and "install a bundle first" in done.stderr


def fake_prefix(tmp_path) -> Path:
    """An installed-looking prefix whose server fails loudly if anything ever starts it."""
    server = tmp_path / "opt" / "current" / "bin" / "vllm-server"
    server.parent.mkdir(parents=True)
    server.write_text("#!/bin/sh\necho 'this test starts no server' >&2\nexit 97\n")
    server.chmod(0o755)
    return tmp_path / "opt"


RECORDED = [  # measured by a real tune run on the vLLM CPU engine (tests/fixtures/tune), replayed here
    {"max_num_seqs": 1, "output_tokens_per_s": 451.8, "requests": 16,
     "latency_ms": {"ttft": {"p50": 139.0, "p95": 149.9, "p99": 155.2}}},
    {"max_num_seqs": 2, "output_tokens_per_s": 842.3, "requests": 16,
     "latency_ms": {"ttft": {"p50": 150.3, "p95": 161.2, "p99": 170.1}}},
]  # fmt: skip


def test_write_back_from_known_points_check_then_write_then_converged(tmp_path):
    """The change contract without a server: every point known from the state file, --check shows the
    drop-in's diff and writes nothing, --write writes it, a rerun changes nothing."""
    from rocmdoctor.provision.tune.state import KIND, context_key

    prefix, target, state = fake_prefix(tmp_path), tmp_path / "target", tmp_path / "state.json"
    target.mkdir()
    model = str(FIXTURES / "model_configs" / "qwen3-8b")
    common = ("--gpu-memory-utilization", "0.5", "--max-model-len", "512", "--prefix", str(prefix))
    unit = run_cli("unit", "--write", "--target", str(target), "--model", model, *common)
    assert unit.returncode == 0, unit.stderr
    tune = ("tune", "--model", model, *common, "--kv-cache-memory", "2GiB", "--seqs", "1,2", "--json",
            "--state-file", str(state), "--target", str(target))  # fmt: skip
    context = plan_of(run_cli(*tune, "--plan-only", root=fixture_root("no-amd-gpu")))["context"]
    entries = {context_key(context): {"context": context, "points": RECORDED}}
    state.write_text(json.dumps({"schema_version": 1, "kind": KIND, "entries": entries}))
    tree, state_bytes = tree_state(target), state.read_bytes()

    checked = run_cli(*tune, "--check", root=fixture_root("no-amd-gpu"))
    assert checked.returncode == 0, checked.stderr
    document = json.loads(checked.stdout)
    CHANGE.validate(document)
    assert document["check"] is True and document["changed"] is True and document["server_starts"] == 0
    assert document["known_points_used"] == 2 and document["winner"]["max_num_seqs"] == 2
    assert "+ExecStart=" in document["diff"] and "--max-num-seqs 2" in document["diff"]
    assert tree_state(target) == tree and state.read_bytes() == state_bytes  # --check wrote nothing

    written = run_cli(*tune, "--write", root=fixture_root("no-amd-gpu"))
    assert written.returncode == 0, written.stderr
    assert json.loads(written.stdout)["diff"] == document["diff"]
    dropin = target / "etc/systemd/system/vllm.service.d/rocmdoctor-tune.conf"
    assert "--max-num-seqs 2" in dropin.read_text()
    again = json.loads(run_cli(*tune, "--write", root=fixture_root("no-amd-gpu")).stdout)
    CHANGE.validate(again)
    assert again["changed"] is False and again["diff"] == ""


def test_the_table_for_people_names_the_winner_and_the_diff(tmp_path):
    from rocmdoctor.provision.tune.state import KIND, context_key

    prefix, state = fake_prefix(tmp_path), tmp_path / "state.json"
    model = str(FIXTURES / "model_configs" / "qwen3-8b")
    tune = ("tune", "--model", model, "--gpu-memory-utilization", "0.5", "--max-model-len", "512",
            "--prefix", str(prefix), "--kv-cache-memory", "2GiB", "--seqs", "1,2", "--state-file", str(state),
            "--slo", "ttft:p95<=155ms", "--confirm", "0", "--margin", "0")  # fmt: skip
    context = plan_of(run_cli(*tune, "--plan-only", "--json", root=fixture_root("no-amd-gpu")))["context"]
    entries = {context_key(context): {"context": context, "points": RECORDED}}
    state.write_text(json.dumps({"schema_version": 1, "kind": KIND, "entries": entries}))
    done = run_cli(*tune, root=fixture_root("no-amd-gpu"))
    assert done.returncode == 0, done.stderr
    assert "winner: --max-num-seqs 1 (451.8 output tokens/s)" in done.stdout  # 2 breaks the limit
    assert "ttft p95 <= 155 ms" in done.stdout and "nothing written (pass --write" in done.stdout
    limited = run_cli(*tune[:-5], "ttft:p95<=100ms", "--confirm", "0", root=fixture_root("no-amd-gpu"))
    assert limited.returncode == 1 and "NO WINNER: no setting met ttft p95 <= 100 ms" in limited.stdout
    assert "best seen: max-num-seqs 1, 451.8 tokens/s" in limited.stdout  # the only one tried


def test_write_back_into_lemonade_saved_options_check_then_write_then_converged(tmp_path):
    """The winner into a Lemonade model's saved vllm_args through its options API (the stand-in speaks
    Lemonade's documented API over loopback): its dry run under --check, then saved, then nothing to do."""
    from harness.lemonade_server import Registered, State, lemonade_server
    from rocmdoctor.provision.tune.state import KIND, context_key

    model_id, key = "user.Qwen3-8B-vLLM", "lemonade-admin-Zq7xV2kP9sW4"
    state_dir = tmp_path / "lemonade-state"
    state_dir.mkdir()
    lemonade = State(state_dir, {model_id: Registered("Qwen/Qwen3-8B")}, admin_key=key)
    lemonade.write_saved({model_id: {"vllm_args": "--enable-auto-tool-choice --max-num-seqs 64"}})
    prefix, state = fake_prefix(tmp_path), tmp_path / "state.json"
    model = str(FIXTURES / "model_configs" / "qwen3-8b")
    tune = ("tune", "--model", model, "--gpu-memory-utilization", "0.5", "--max-model-len", "512",
            "--prefix", str(prefix), "--kv-cache-memory", "2GiB", "--seqs", "1,2", "--json",
            "--state-file", str(state), "--lemonade-model", model_id)  # fmt: skip
    context = plan_of(run_cli(*tune, "--plan-only", root=fixture_root("no-amd-gpu")))["context"]
    entries = {context_key(context): {"context": context, "points": RECORDED}}
    state.write_text(json.dumps({"schema_version": 1, "kind": KIND, "entries": entries}))
    env = {"LEMONADE_ADMIN_API_KEY": key}
    with lemonade_server(lemonade) as server:
        url = ("--lemonade-url", server.url)
        checked = json.loads(run_cli(*tune, *url, "--check", root=fixture_root("no-amd-gpu"), env=env).stdout)
        after_check = lemonade.saved()
        written = json.loads(run_cli(*tune, *url, "--write", root=fixture_root("no-amd-gpu"), env=env).stdout)
        again = json.loads(run_cli(*tune, *url, "--write", root=fixture_root("no-amd-gpu"), env=env).stdout)
    for document in (checked, written, again):
        CHANGE.validate(document)
    assert checked["changed"] is True and checked["check"] is True and checked["dry_run"] is True
    assert "--max-num-seqs 2" in checked["diff"] and checked["server_starts"] == 0
    assert after_check[model_id]["vllm_args"] == "--enable-auto-tool-choice --max-num-seqs 64"  # untouched
    assert written["changed"] is True
    saved = lemonade.saved()[model_id]["vllm_args"]
    assert "--max-num-seqs 2" in saved and "--enable-auto-tool-choice" in saved and "64" not in saved
    assert again["changed"] is False and again["diff"] == ""


@pytest.mark.parametrize("mode", ["--write", "--check"])
def test_a_target_without_the_unit_is_refused_before_anything_is_measured(tmp_path, mode):
    """Issue 35: `tune --write --target DIR` without the unit in DIR was found out only after all the
    measuring. Now it is exit 2 at once: the prefix's server (which exits 97 if started) never starts."""
    prefix, target = fake_prefix(tmp_path), tmp_path / "empty-target"
    target.mkdir()
    model = str(FIXTURES / "model_configs" / "qwen3-8b")
    done = run_cli("tune", "--model", model, "--gpu-memory-utilization", "0.5", "--max-model-len", "512",
                   "--prefix", str(prefix), "--kv-cache-memory", "2GiB", "--seqs", "1,2", "--json",
                   "--state-file", str(tmp_path / "state.json"), mode, "--target", str(target),
                   root=fixture_root("no-amd-gpu"))  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "nothing measured" in done.stderr and "vllm.service does not exist" in done.stderr
    assert "rocmdoctor unit --write" in done.stderr and "Traceback" not in done.stderr
    assert '"event": "plan"' not in done.stderr and '"event": "starting"' not in done.stderr
    assert list(target.iterdir()) == [] and not (tmp_path / "state.json").exists()


def _record(prefix: Path, version: str) -> Path:
    """The bundle's own answer as install keeps it (provision/bundle/ask_vllm.keep): the probe's document,
    here the one vLLM `version`'s own parser gave (the shipped table was generated by the same probe)."""
    from importlib import resources

    from rocmdoctor.vllm.surface import RECORD

    table = resources.files("rocmdoctor.vllm") / "surfaces" / f"{version}.json"
    record = prefix / "current" / RECORD
    record.write_bytes(table.read_bytes())
    return record


def test_write_back_is_judged_by_the_installed_bundles_vllm(tmp_path):
    """The unit's command line carries a flag only vLLM 0.32 has (written for a newer bundle, then the
    prefix went back to 0.20.1): tune refuses to write its drop-in, naming the version and the first that
    has it (exit 2), before anything is measured; with a 0.32 bundle the same unit is written and a
    deprecated flag is noted in the envelope, which names the vLLM that judged it."""
    from rocmdoctor.provision.tune.state import KIND, context_key

    prefix, target, state = fake_prefix(tmp_path), tmp_path / "target", tmp_path / "state.json"
    target.mkdir()
    record = _record(prefix, "0.20.1")
    model = str(FIXTURES / "model_configs" / "qwen3-8b")
    common = ("--gpu-memory-utilization", "0.5", "--max-model-len", "512", "--prefix", str(prefix))
    assert run_cli("unit", "--write", "--target", str(target), "--model", model, *common).returncode == 0
    unit = target / "etc/systemd/system/vllm.service"
    text = unit.read_text()
    unit.write_text(
        text.replace(
            " --max-model-len", " --max-num-scheduled-tokens 8 --disable-cascade-attn --max-model-len", 1
        )
    )
    tune = ("tune", "--model", model, *common, "--kv-cache-memory", "2GiB", "--seqs", "1,2", "--json",
            "--state-file", str(state), "--target", str(target))  # fmt: skip
    context = plan_of(run_cli(*tune, "--plan-only", root=fixture_root("no-amd-gpu")))["context"]
    entries = {context_key(context): {"context": context, "points": RECORDED}}
    state.write_text(json.dumps({"schema_version": 1, "kind": KIND, "entries": entries}))

    refused = run_cli(*tune, "--write", root=fixture_root("no-amd-gpu"))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert (
        "nothing measured: the unit's command line does not fit the installed bundle: --max-num-scheduled-tokens needs vLLM 0.32.0 or newer; the bundle has vLLM 0.20.1"
        in refused.stderr
    )
    assert f"asked the bundle: {record}" in refused.stderr and "rocmdoctor unit --write" in refused.stderr
    assert not (target / "etc/systemd/system/vllm.service.d").exists()

    _record(prefix, "0.32.0")
    written = run_cli(*tune, "--write", root=fixture_root("no-amd-gpu"))
    assert written.returncode == 0, written.stderr
    document = json.loads(written.stdout)
    CHANGE.validate(document)
    assert document["vllm"].startswith("vLLM 0.32.0 (asked the bundle: ")
    assert document["notes"] == [
        "--disable-cascade-attn is deprecated in " + document["vllm"] + ": --disable-cascade-attn is "
        "deprecated and has no effect since cascade attention has been removed. It will be removed in v0.33.0."
    ]
