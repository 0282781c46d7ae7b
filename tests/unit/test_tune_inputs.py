"""What `rocmdoctor tune` reads and writes besides the server: the workload file, the state file, the
drop-in it writes the winner into (all in-process, no server)."""

from __future__ import annotations

import json

import pytest

from rocmdoctor.host_writes import HostWriter
from rocmdoctor.provision.server.unit import command_line
from rocmdoctor.provision.tune.search import Measurement, Setting
from rocmdoctor.provision.tune.state import State, stable_argv
from rocmdoctor.provision.tune.workload import (
    MAX_FILE_BYTES,
    WorkloadError,
    parse_jsonl,
    request_bodies,
    synthetic,
)
from rocmdoctor.provision.tune.writeback import (
    DROPIN_NAME,
    WritebackError,
    exec_start,
    with_setting,
    write_back,
)

GOOD = b'{"prompt": "Classify: the pump failed", "output_tokens": 4}\n\n# a comment\n{"prompt": "x", "output_tokens": 1, "label": "kept"}\n'


def test_workload_lines_are_read_typed():
    workload = parse_jsonl(GOOD, "jobs.jsonl", seed=7)
    assert [(i.prompt, i.output_tokens) for i in workload.items] == [
        ("Classify: the pump failed", 4),
        ("x", 1),
    ]
    assert workload.to_json()["requests_in_file"] == 2 and workload.seed == 7


@pytest.mark.parametrize(
    ("data", "line", "field"),
    [
        (GOOD + b'{"prompt": "y"}\n', 5, "output_tokens"),
        (b'{"prompt": "y", "output_tokens": 0}\n', 1, "output_tokens"),
        (b'{"prompt": "y", "output_tokens": 99999999}\n', 1, "output_tokens"),
        (b'{"prompt": 3, "output_tokens": 2}\n', 1, "prompt"),
        (b'{"prompt": "", "output_tokens": 2}\n', 1, "prompt"),
        (b'["prompt", 2]\n', 1, ""),
        (b'{"prompt": "a", "output_tokens": 2}\n{"prompt": "a", "output_tokens": NaN}\n', 2, ""),
        (b'{"prompt": "a", "output_tokens": 2\n', 1, ""),
        (b"\xff\xfe\n", 1, ""),
        (
            b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[" * 100 + b"\n",
            1,
            "",
        ),
    ],
)
def test_a_bad_line_is_named_with_the_form_to_write(data, line, field):
    with pytest.raises(WorkloadError) as caught:
        parse_jsonl(data, "jobs.jsonl")
    text = str(caught.value)
    assert f"jobs.jsonl line {line}:" in text and '"output_tokens": <1..65536>' in text
    assert field in text
    assert len(text) < 800  # never echoes a huge value


def test_empty_and_oversized_workloads_are_refused():
    with pytest.raises(WorkloadError, match="no requests"):
        parse_jsonl(b"\n# nothing\n", "jobs.jsonl")
    with pytest.raises(WorkloadError, match="larger than"):
        parse_jsonl(b" " * (MAX_FILE_BYTES + 1), "jobs.jsonl")


def test_every_request_of_every_trial_is_fresh_for_the_prefix_cache_and_the_seed_fixes_the_order():
    workload = parse_jsonl(GOOD, "jobs.jsonl", seed=3)
    first = request_bodies(workload, "m", None, 6, trial=1)
    second = request_bodies(workload, "m", None, 6, trial=2)
    prompts = [b["prompt"] for b in first + second]
    assert len(set(prompts)) == 12
    # vLLM's prefix cache matches whole 16-token blocks from the start: the first words already differ.
    assert len({p.split("]")[0] for p in prompts}) == 12
    assert request_bodies(workload, "m", None, 6, trial=1) == first  # fixed seed: the same run again
    assert all(b["ignore_eos"] and b["max_tokens"] in (1, 4) for b in first)


def test_synthetic_prompts_are_token_ids_of_the_asked_length_and_unique_across_trials():
    workload = synthetic(prompt_tokens=24, output_tokens=8)
    ids = list(range(100, 130))
    bodies = request_bodies(workload, "m", ids, 5, 1) + request_bodies(workload, "m", ids, 5, 2)
    assert all(len(b["prompt"]) == 24 and b["max_tokens"] == 8 for b in bodies)
    assert len({tuple(b["prompt"][:4]) for b in bodies}) == 10


def point(seqs: int, tokens_per_s: float, error: str = "") -> Measurement:
    return Measurement(
        Setting(seqs), tokens_per_s, 8, 0, {"ttft": {"p50": 1.0, "p95": 2.0, "p99": 3.0}}, error=error
    )


def test_state_round_trip_keeps_known_points_per_context():
    context = {
        "host": "h",
        "bundle": "b@sha256:1",
        "model_revision": "sha256:2",
        "server_argv": ["--model", "m"],
    }
    state = State()
    state.add(context, [point(1, 10.0), point(2, 19.5), point(4, 0.0, error="not ready after 900 s")])
    again = State.parse(state.to_bytes(), "state.json")
    known = again.known(context)
    assert [(p.setting.max_num_seqs, p.output_tokens_per_s, p.source) for p in known] == [
        (1, 10.0, "state"),
        (2, 19.5, "state"),
    ]
    assert known[0].latency_ms["ttft"]["p95"] == 2.0
    # A new bundle (or model revision, host, arguments) is a new context: nothing is known for it.
    assert again.known({**context, "bundle": "b@sha256:9"}) == []


@pytest.mark.parametrize(
    "data",
    [b"not json", b'{"schema_version": 1, "kind": "other", "entries": {}}', b'{"schema_version": 1}',
     b'{"schema_version": 1, "kind": "rocmdoctor-tune-state", "entries": {"k": {"context": {}, "points": [{"max_num_seqs": -1, "output_tokens_per_s": 1}]}}}'],
)  # fmt: skip
def test_a_damaged_state_file_is_not_trusted_and_says_so(data):
    state = State.parse(data, "state.json")
    assert state.entries == {} and "state.json" in state.problem and "replaced" in state.problem


def test_the_state_context_ignores_the_port_and_the_tuned_flags():
    argv = [
        "--model",
        "m",
        "--port",
        "8001",
        "--max-num-seqs",
        "4",
        "--max-num-batched-tokens=512",
        "--enforce-eager",
    ]
    assert stable_argv(argv) == ["--model", "m", "--enforce-eager"]


UNIT = (
    "[Service]\n"
    "Environment=A=1\n"
    "ExecStart="
    + command_line(
        [
            "/opt/rocmdoctor/current/bin/vllm-server",
            "--model",
            "/srv/models/my model",
            "--max-num-seqs",
            "10",
            "--served-model-name",
            "50%$off",
            "--enforce-eager",
        ]
    )  # fmt: skip
    + "\nExecStartPost=/bin/true\n"
)


def test_the_drop_in_keeps_every_argument_of_the_installed_unit_and_replaces_the_tuned_ones(tmp_path):
    writer = HostWriter(tmp_path)
    writer.write_file("/etc/systemd/system/vllm.service", UNIT.encode(), 0o644)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    checked = write_back(HostWriter(tmp_path, check_mode=True), None, Setting(6, 2048), "measured.")
    assert checked.changed and checked.check and "+ExecStart=" in checked.files[0].diff
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # --check wrote nothing
    done = write_back(writer, None, Setting(6, 2048), "measured.")
    dropin = tmp_path / "etc/systemd/system/vllm.service.d" / DROPIN_NAME
    text = dropin.read_text()
    assert done.changed and done.files[0].diff == checked.files[0].diff
    assert "\nExecStart=\nExecStart=" in text
    argv = exec_start(text.replace("ExecStart=\n", ""), "drop-in")
    assert argv == ["/opt/rocmdoctor/current/bin/vllm-server", "--model", "/srv/models/my model",
                    "--served-model-name", "50%$off", "--enforce-eager",
                    "--max-num-seqs", "6", "--max-num-batched-tokens", "2048"]  # fmt: skip
    envelope = done.to_json()
    assert envelope["schema_version"] == 1 and envelope["changed"] is True
    assert not write_back(writer, None, Setting(6, 2048), "measured.").changed  # converged


def test_an_instance_drop_in_keeps_the_template_references(tmp_path):
    template = "ExecStart=/opt/rd/current/bin/vllm-server --model m --max-num-seqs 4 --port ${ROCMDOCTOR_PORT} --gpu-memory-utilization ${ROCMDOCTOR_GPU_MEMORY_UTILIZATION}\n"
    writer = HostWriter(tmp_path)
    writer.write_file("/etc/systemd/system/vllm@.service", template.encode(), 0o644)
    write_back(writer, "3", Setting(12), "measured.")
    text = (tmp_path / "etc/systemd/system/vllm@3.service.d" / DROPIN_NAME).read_text()
    assert (
        "--max-num-seqs 12 --port ${ROCMDOCTOR_PORT} --gpu-memory-utilization ${ROCMDOCTOR_GPU_MEMORY_UTILIZATION}"
        in text
    )


def test_write_back_without_a_unit_says_to_write_it_first(tmp_path):
    with pytest.raises(WritebackError, match="rocmdoctor unit --write"):
        write_back(HostWriter(tmp_path), None, Setting(4), "measured.")
    with pytest.raises(WritebackError, match="vllm@N"):
        write_back(HostWriter(tmp_path), "../x", Setting(4), "measured.")
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    (tmp_path / "etc/systemd/system/vllm.service").write_text("[Service]\nExecStart=/a\nExecStart=/b\n")
    with pytest.raises(WritebackError, match="2 ExecStart= lines"):
        write_back(HostWriter(tmp_path), None, Setting(4), "measured.")


def test_with_setting_accepts_both_spellings():
    assert with_setting(["x", "--max-num-seqs=3", "--max-num-batched-tokens", "9", "y"], Setting(5)) == [
        "x", "y", "--max-num-seqs", "5"]  # fmt: skip
    assert json.dumps(Setting(5).to_json()) == '{"max_num_seqs": 5, "max_num_batched_tokens": null}'


def test_a_seqs_list_beyond_what_the_kv_cache_holds_is_refused_a_range_is_clipped():
    from rocmdoctor.provision.tune.session import SeqsError, searchable_seqs

    workload = synthetic(96, 32, seed=0)  # 128 tokens a request
    assert searchable_seqs("1,2,4", 4 * 128, workload) == [1, 2, 4]
    with pytest.raises(SeqsError, match=r"--seqs 8,16: the KV cache holds 4 requests of 128 tokens"):
        searchable_seqs("1,8,16", 4 * 128, workload)
    assert max(searchable_seqs("1:auto", 4 * 128, workload)) == 4
    with pytest.raises(SeqsError, match="give LOW:HIGH"):
        searchable_seqs("0,1", 4 * 128, workload)
