"""Every reader of a foreign document, over the hostile classes: nesting deep enough to overflow a
recursive parser, integers of thousands of digits, numbers out of range, bytes that are not UTF-8,
lone surrogates, truncation and random bytes. The property: each reader gives its own clear error
(a DocumentError, UserError or ManifestError that names the document) or a safe value, never a
RecursionError, a ValueError of int(), an OverflowError or a UnicodeError.

The readers are the ones documents.py serves (tests/unit/test_mechanisms.py proves there is no other):
Lemonade's config file, a bench report, the cluster's input, the qualification record (the cache
purge's and the textfile's), the cluster's bundle record, the textfile's bundle metadata, the JIT
check's records and a fleet's TOML manifest. Lemonade's and vLLM's answers are the same
reader behind the one HTTP client (tests/cli/test_hostile_lemonade.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rocmdoctor.cli import App
from rocmdoctor.commands.common import UserError
from rocmdoctor.documents import DocumentError, load_toml, load_value
from rocmdoctor.facts.manifest import ManifestError, parse_manifest
from rocmdoctor.host import Host
from rocmdoctor.registry import Context, Options

DEEP = 200_000
HUGE = "9" * 5000

# The hostile corpus: each a document some attacker wrote, shaped like what the reader expects.
CORPUS: list[bytes] = [
    b"[" * DEEP + b"]" * DEEP,
    b'{"a":' * DEEP + b"1" + b"}" * DEEP,
    b'{"knee": ' * 50_000 + b"{}" + b"}" * 50_000,
    ('{"port": %s}' % HUGE).encode(),
    ('{"knee": {"recommended_max_num_seqs": %s}}' % HUGE).encode(),
    ('{"global_timeout": %s, "port": -%s}' % (HUGE, HUGE)).encode(),
    ('{"tag": "t", "bundle_digest": "d", "qualified": true, "host_gfx": %s}' % HUGE).encode(),
    b'{"port": 1e999, "knee": {"recommended_max_num_seqs": 1e999, "output_tokens_per_s": -1e999}}',
    b'{"port": NaN, "knee": Infinity}',
    b'{"tag": "\\udc80", "family": "\\ud800x", "qualified": "\\udfff"}',
    b'{"tag": "\xff\xfe", "family": "\xc3\x28"}',
    b"\xff\xfe\x00{\x00}",
    b'{"knee": {"recommended_max_num_seqs": 8',  # truncated
    b'{"nodes": [' + b'{"node": "n", "probes": [' * 1000 + b"]}" * 1000 + b"]}",
    b"",
    b"null",
    b'"just a string"',
]

documents = st.one_of(
    st.sampled_from(CORPUS),
    st.binary(max_size=80),
    # a JSON object of the expected keys whose values are anything, the huge and the odd included
    st.dictionaries(
        st.sampled_from(
            ["port", "knee", "tag", "family", "qualified", "bundle_digest", "global_timeout", "nodes"]
        ),
        st.one_of(
            st.integers(),
            st.floats(),
            st.text(max_size=8),
            st.just({"recommended_max_num_seqs": 10**4000}),
            st.lists(st.integers(), max_size=3),
        ),
        max_size=5,
    ).map(lambda d: json.dumps(d, allow_nan=True).encode()),
    st.integers(min_value=10**20, max_value=10**4000).map(lambda n: b'{"port": %d}' % n),
)


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _bundle_tree(root: Path, name: str, data: bytes) -> str:
    """A prefix with `current` -> bundles/TAG holding `name` = data; returns the prefix."""
    prefix = root / "opt/rocmdoctor"
    tree = prefix / "bundles" / "tag1"
    _write(tree / name, data)
    if not (prefix / "current").is_symlink():
        os.symlink("bundles/tag1", prefix / "current")
    return str(prefix)


def lemonade_config(root: Path, data: bytes) -> Any:
    from rocmdoctor.commands.lemonade_targets import lemonade_url

    _write(root / "var/lib/lemonade/config.json", data)
    url = lemonade_url(App(root=root), None)
    assert url.startswith("http://127.0.0.1:") and 0 < int(url.rsplit(":", 1)[1]) < 65536
    return url


def bench_report(root: Path, data: bytes) -> Any:
    from rocmdoctor.commands.lemonade_targets import bench_knee

    _write(root / "bench.json", data)
    knee, why = bench_knee(root / "bench.json")
    assert knee is None or 0 < knee <= 65536
    return knee, why


def cluster_input(root: Path, data: bytes) -> Any:
    from rocmdoctor.cluster.documents import parse_input

    return parse_input(data, "--input x")


def qualification_record(root: Path, data: bytes) -> Any:
    from rocmdoctor.provision.bundle.qualify import QUALIFICATION, recorded

    _write(root / "tree" / QUALIFICATION, data)
    doc = recorded(root / "tree")
    assert doc is None or isinstance(doc, dict)
    return doc


def cluster_bundle_record(root: Path, data: bytes) -> Any:
    from rocmdoctor.cluster.facts import bundle
    from rocmdoctor.facts.installed_bundle import QUALIFICATION

    prefix = _bundle_tree(root, QUALIFICATION, data)
    doc = bundle(Host(root), prefix[len(str(root)) :])
    assert doc["tag"] is None or isinstance(doc["tag"], str)
    return doc


def textfile_bundle_metadata(root: Path, data: bytes) -> Any:
    from rocmdoctor.commands.health_textfile import active_bundle
    from rocmdoctor.facts.installed_bundle import METADATA as BUNDLE_METADATA

    prefix = _bundle_tree(root, BUNDLE_METADATA, data)
    return active_bundle(Context(Host(root), Options(prefix=prefix[len(str(root)) :])))


def jit_records(root: Path, data: bytes) -> Any:
    from rocmdoctor.checks.jit_cache import RECORD, _current

    prefix = _bundle_tree(root, RECORD, data)
    return _current(Context(Host(root), Options(prefix=prefix[len(str(root)) :])))


def any_json(root: Path, data: bytes) -> Any:
    return load_value(data, "x", 1 << 20)


def toml_manifest(root: Path, data: bytes) -> Any:
    return parse_manifest(data.decode("utf-8", "surrogateescape"), "--bundles-dir manifest.toml")


READERS: dict[str, Callable[[Path, bytes], Any]] = {
    "lemonade-config": lemonade_config,
    "bench-report": bench_report,
    "cluster-input": cluster_input,
    "qualification-record": qualification_record,
    "cluster-bundle-record": cluster_bundle_record,
    "textfile-bundle-metadata": textfile_bundle_metadata,
    "jit-records": jit_records,
    "any-json": any_json,
    "toml-manifest": toml_manifest,
}
CLEAR = (DocumentError, UserError, ManifestError)


def _read(reader: Callable[[Path, bytes], Any], root: Path, data: bytes) -> None:
    try:
        reader(root, data)
    except CLEAR as exc:
        text = str(exc)
        assert text and len(text) < 2000 and HUGE[:100] not in text, text


@pytest.mark.parametrize("name", sorted(READERS))
@pytest.mark.parametrize("index", range(len(CORPUS)))
def test_every_reader_survives_the_hostile_corpus(tmp_path: Path, name: str, index: int):
    _read(READERS[name], tmp_path, CORPUS[index])


@pytest.mark.parametrize("name", sorted(READERS))
def test_every_reader_gives_a_clear_error_or_a_safe_value(tmp_path_factory, name: str):
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(data=documents)
    def prop(data: bytes) -> None:
        _read(READERS[name], tmp_path_factory.mktemp(name), data)

    prop()


@pytest.mark.parametrize(
    "text",
    [
        "a = " + "[" * 100_000 + "]" * 100_000,
        "a = " + HUGE,
        "a = 1e999\nb = nan",
        "[" * 50_000,
        "a = 1979-05-27T07:32:00Z\nb = 9999-99-99T99:99:99Z",
        "a = \udc80",
    ],
)
def test_toml_is_read_under_the_same_bounds(text: str):
    try:
        load_toml(text, "manifest.toml", 1 << 20)
    except DocumentError as exc:
        assert str(exc).startswith("manifest.toml: ") and HUGE[:50] not in str(exc)


def test_the_textfile_is_written_with_labels_that_are_not_utf8(tmp_path: Path):
    """A bundle tag read through a link whose name is not UTF-8 (surrogateescape) and a server name
    with a lone surrogate: the textfile is still rendered, the label escaped."""
    from rocmdoctor.rendering.textfile import render
    from rocmdoctor.vllm.health_metrics import BundleInfo, HealthRun, ServerHealth

    run = HealthRun(version="1", finished_at=1.0, duration_s=0.1, checks=[], actions={})
    run.bundle = BundleInfo(
        tag=b"tag-\xff".decode("utf-8", "surrogateescape"), family="x", digest="d", qualified="yes"
    )
    run.servers = [ServerHealth("vllm@\ud800", 'http://a"b\n', "")]
    text = render(run)
    text.encode("utf-8")  # the file's encoding cannot fail
    assert 'tag="tag-\\\\udcff"' in text
    assert 'server="vllm@\\\\ud800"' in text and 'url="http://a\\"b\\n"' in text


def test_the_cluster_input_bounds_what_a_stranger_sizes():
    """65,536 probes are read; one more is refused while parsing, before any of them is kept (300,000
    probes took 1.3 GB through the report); a document over the byte cap is refused before parsing."""
    from rocmdoctor.cluster.documents import MAX_INPUT_BYTES, MAX_PROBES, parse_input
    from rocmdoctor.model import SCHEMA_VERSION

    probe = {"source": "a", "target": "b", "address": "10.0.0.2", "port": 29501, "ok": True}
    node = {"node": "a", "schema_version": SCHEMA_VERSION}
    _, probes = parse_input(json.dumps({"nodes": [node], "probes": [probe] * MAX_PROBES}).encode(), "x")
    assert len(probes) == MAX_PROBES
    with pytest.raises(DocumentError, match="probes"):
        parse_input(json.dumps({"nodes": [node], "probes": [probe] * (MAX_PROBES + 1)}).encode(), "x")
    with pytest.raises(DocumentError, match="larger than"):
        parse_input(b" " * (MAX_INPUT_BYTES + 1), "x")
