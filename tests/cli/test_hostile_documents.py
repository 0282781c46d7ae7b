"""One bounded, typed reader for every foreign JSON document. Generated hostile documents (deep nesting,
5,000-digit integers, NaN and Infinity, numbers outside their ranges, wrong types, random bytes, random
valid JSON) go to every reader: config.json, a safetensors header, the shard index, the Hub's file list,
the release API's answer, lock.json, a bundle's metadata, a replayed tree's meta file, the deep probe's
report and the OpenAI client's answers. Each either reads the document or refuses it with its own error,
naming the document (and the field where one is wrong) in a bounded message; nothing else escapes
(no RecursionError, no ValueError from int(), no TypeError), and nothing allocates by a number it read."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.hostile_http import hostile_server
from rocmdoctor.facts.manifest import ManifestError
from rocmdoctor.host import Host
from rocmdoctor.provision.bundle.github_release import ApiOptions, ReleaseError, fetch_release
from rocmdoctor.provision.bundle.install import InstallPlan, Layout, Source, _matches
from rocmdoctor.provision.bundle.manifest import Asset, parse_lock
from rocmdoctor.provision.server.hub import HubClient, HubError
from rocmdoctor.provision.verify.openai_client import ServerError, _json
from rocmdoctor.vllm.model_files import ModelFilesError, read_config, read_header, shard_names

MAX_MESSAGE = 1200
TAG = "vllm0.22.1-rocm7.13.0-gfx1151"
FIELDS = ("num_hidden_layers", "num_attention_heads", "hidden_size", "head_dim", "vocab_size")


def _nest(depth: int, inner: bytes = b"1") -> bytes:
    return b"[" * depth + inner + b"]" * depth


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)

hostile = st.one_of(
    st.integers(200, 200_000).map(_nest),
    st.integers(200, 50_000).map(lambda d: b'{"a": ' + _nest(d) + b"}"),
    st.integers(20, 5000).map(lambda n: b'{"num_hidden_layers": ' + b"7" * n + b"}"),
    st.integers(20, 5000).map(lambda n: b"[" + b"9" * n + b"]"),
    st.sampled_from([b"NaN", b"[Infinity]", b'{"x": -Infinity}', b"1e999", b'{"a": 1e400}']),
    st.sampled_from(
        [b'{"assets": "abc"}', b'{"assets": [1]}', b'{"family": 5}', b'{"weight_map": {"a": 1}}']
    ),
    st.binary(max_size=64),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.tuples(
        st.sampled_from(FIELDS),
        st.sampled_from([0, -1, 10**9, 2**63 - 1, 2**64, True, "32", [32], None, 1.5]),
    ).map(lambda kv: json.dumps({"num_hidden_layers": 2, "hidden_size": 64, kv[0]: kv[1]}).encode()),
)


def _config(tmp: Path, data: bytes) -> Any:
    path = tmp / "config.json"
    path.write_bytes(data)
    return read_config(path)


def _header(tmp: Path, data: bytes) -> Any:
    path = tmp / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(data)) + data)
    return read_header(path)


def _index(tmp: Path, data: bytes) -> Any:
    return shard_names(data, "model.safetensors.index.json")


def _lock(tmp: Path, data: bytes) -> Any:
    return parse_lock(data.decode("utf-8", errors="replace"), "lock.json")


def _metadata(tmp: Path, data: bytes) -> Any:
    bundle = tmp / "prefix" / "bundles" / TAG
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / ".rocmdoctor-bundle.json").write_bytes(data)
    meta = Layout(tmp / "prefix").metadata(TAG)
    plan = InstallPlan(tmp / "prefix", "gfx1151", TAG, "o/r", [Source(Asset(f"{TAG}-x64.tar.gz", 1, None))])
    _matches(meta, plan)  # what install does with it: never a crash
    return Layout(tmp / "prefix").installed()


def _meta_file(tmp: Path, data: bytes) -> Any:
    root = tmp / "tree"
    (root / ".rocmdoctor").mkdir(parents=True, exist_ok=True)
    (root / ".rocmdoctor" / "stat.json").write_bytes(data)
    return Host(root).read_json_meta("stat.json")


def _probe(tmp: Path, data: bytes) -> Any:
    from rocmdoctor.checks.deep import parse_report

    return parse_report(data.decode("utf-8", errors="replace"))


def _openai(tmp: Path, data: bytes) -> Any:
    return _json("/v1/models", data)


class _Never(Exception):
    """Readers that answer None for an unusable document raise nothing at all."""


LOCAL_READERS = {
    "config.json": (_config, ModelFilesError),
    "safetensors header": (_header, ModelFilesError),
    "shard index": (_index, ModelFilesError),
    "lock.json": (_lock, ManifestError),
    "bundle metadata": (_metadata, _Never),  # an unusable metadata file reads as None: incomplete
    "replay meta file": (_meta_file, _Never),
    "deep probe report": (_probe, _Never),
    "OpenAI answer": (_openai, ServerError),
}


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reader=st.sampled_from(sorted(LOCAL_READERS)), data=hostile)
def test_every_local_reader_reads_or_refuses_a_hostile_document_cleanly(
    tmp_path: Path, reader: str, data: bytes
):
    fn, error = LOCAL_READERS[reader]
    try:
        fn(tmp_path, data)
    except error as exc:
        assert len(str(exc)) <= MAX_MESSAGE, (reader, str(exc)[:200])


@settings(max_examples=40, deadline=None)
@given(data=hostile, which=st.sampled_from(["hub", "release"]))
def test_hub_and_release_answers_are_read_or_refused_cleanly(data: bytes, which: str):
    with hostile_server("ok", data) as server:
        try:
            if which == "hub":
                HubClient("org/model", endpoint=server.url, deadline_s=5).listing()
            else:
                fetch_release("o/r", TAG, server.url, ApiOptions(2, 2, 5))
        except (HubError, ReleaseError) as exc:
            assert len(str(exc)) <= MAX_MESSAGE
            assert server.url in str(exc) or "org/model" in str(exc) or TAG in str(exc)


@pytest.mark.parametrize(
    "field, value, said",
    [
        ("num_hidden_layers", 10**9, "$.num_hidden_layers"),
        ("num_attention_heads", 0, "$.num_attention_heads"),
        ("hidden_size", "4096", "$.hidden_size"),
        ("head_dim", True, "$.head_dim"),
        ("rope_scaling", {"factor": -4.0, "rope_type": "linear"}, "$.rope_scaling.factor"),
        ("layer_types", ["full_attention"] * 5000, "$.layer_types"),
    ],
)
def test_a_config_field_out_of_its_range_is_exit_2_naming_file_and_field(
    tmp_path: Path, field: str, value: Any, said: str
):
    from click.testing import CliRunner

    from rocmdoctor.cli import cli

    model = tmp_path / "m"
    model.mkdir()
    config = {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 64, "vocab_size": 10}
    (model / "config.json").write_text(json.dumps({**config, field: value}))
    result = CliRunner().invoke(cli, ["plan", "--model", str(model), "--memory", "8GiB"])
    assert result.exit_code == 2, result.output
    assert str(model / "config.json") in result.output and said in result.output
    assert "Traceback" not in result.output


def test_a_huge_index_is_deduplicated_in_linear_time(tmp_path: Path):
    import time

    weight_map = {f"t{i}": f"model-{i % 1000:05d}-of-01000.safetensors" for i in range(300_000)}
    data = json.dumps({"weight_map": weight_map}).encode()
    started = time.process_time()
    names = shard_names(data, "index")
    assert len(names) == 1000 and time.process_time() - started < 2.0


def test_a_header_length_beyond_the_cap_is_refused_before_reading(tmp_path: Path):
    path = tmp_path / "big.safetensors"
    path.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(ModelFilesError, match="header length"):
        read_header(path)


@pytest.mark.parametrize("doc", [b'{"assets": "abc"}', b'{"assets": [1]}', b'{"family": 5}', _nest(5000)])
def test_bundle_metadata_of_the_wrong_shape_reads_as_an_incomplete_bundle(tmp_path: Path, doc: bytes):
    bundle = tmp_path / "prefix" / "bundles" / TAG
    bundle.mkdir(parents=True)
    (bundle / ".rocmdoctor-bundle.json").write_bytes(doc)
    assert Layout(tmp_path / "prefix").metadata(TAG) is None
    assert _metadata(tmp_path, doc)[0]["family"] is None


def test_a_fifo_named_like_a_shard_is_refused_at_once(tmp_path: Path):
    import os

    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(ModelFilesError, match="not a regular file"):
        read_header(fifo)
