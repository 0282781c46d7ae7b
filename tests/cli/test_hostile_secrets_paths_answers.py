"""Secrets, paths and answers, over generated inputs.

- Secrets: a token with a line break or a control character (HF_TOKEN, the Hugging Face token file,
  GITHUB_TOKEN) is exit 2 and no piece of it is printed; the token file is read under the key-file rule
  (a link to /etc/shadow is refused unread, a file of another owner is refused); the one redactor removes
  every registered credential, Authorization header, Bearer value and URL userinfo from any message.
- Paths: a Hub revision is a ref name or a 40-hex commit, a refs/ file holds a 40-hex commit, and what
  `plan` reads from the cache stays inside it.
- Answers: --json is strict JSON (no NaN, no Infinity: null and a reason); tags are whole strings (a
  trailing newline is refused); numeric options are refused outside their domains.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.hostile_http import hostile_server
from rocmdoctor.cli import cli
from rocmdoctor.facts.manifest import ManifestError, check_tag
from rocmdoctor.report import dumps
from rocmdoctor.sensitive import redact_message, register_secret
from rocmdoctor.vllm.model_files import ModelFilesError, cached_snapshot, check_revision

HC = [HealthCheck.function_scoped_fixture]
TOKEN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
tokens = st.text(alphabet=TOKEN_CHARS, min_size=12, max_size=40)
breaks = st.sampled_from(["\n", "\r\n", "\r", "\x01", " ", "\t", "\x7f"])  # no NUL: no environment holds one


def _invoke(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    result = CliRunner().invoke(cli, args, env=env)
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes is not None else "")


def _pieces(secret: str) -> list[str]:
    return [
        p
        for p in secret.replace("\r", "\n")
        .replace("\x01", "\n")
        .replace("\x7f", "\n")
        .replace("\t", "\n")
        .split()
        if len(p) >= 6
    ]


@settings(max_examples=15, deadline=None, suppress_health_check=HC)
@given(head=tokens, tail=tokens, cut=breaks, where=st.sampled_from(["HF_TOKEN", "file", "GITHUB_TOKEN"]))
def test_a_malformed_token_is_exit_2_and_never_printed(tmp_path_factory, head, tail, cut, where):
    home = tmp_path_factory.mktemp("home")
    token = f"hf_{head}{cut}{tail}"
    env = {"HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "HF_TOKEN": "", "GITHUB_TOKEN": ""}
    with hostile_server("ok", b"{}") as server:
        env["HF_ENDPOINT"] = server.url
        env["ROCMDOCTOR_GITHUB_API"] = server.url
        if where == "HF_TOKEN":
            env["HF_TOKEN"] = token
        elif where == "file":
            (home / "token").write_text(token + "\n")
        else:
            env["GITHUB_TOKEN"] = token
        if where == "GITHUB_TOKEN":
            args = ["install", "--tag", "vllm0.22.1-rocm7.13.0-gfx1151", "--prefix", str(home / "p")]
        else:
            args = ["plan", "--model", "org/model", "--memory", "8GiB"]
        code, out = _invoke(args, env)
    assert code == 2, out
    assert "Traceback" not in out
    for piece in _pieces(token):
        assert piece not in out, (piece, out)


def test_the_token_file_is_never_read_through_a_link_nor_from_another_owner(tmp_path: Path):
    shadow = tmp_path / "shadow"
    shadow.write_text("root:$6$secrethashvalue$xyz:19000:0:99999:7:::\n")
    home = tmp_path / "hf"
    home.mkdir()
    (home / "token").symlink_to(shadow)
    env = {
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(tmp_path / "c"),
        "HF_TOKEN": "",
        "HF_ENDPOINT": "http://127.0.0.1:9",
    }
    code, out = _invoke(["plan", "--model", "org/model", "--memory", "8GiB"], env)
    assert code == 2 and "symbolic link" in out and "secrethashvalue" not in out
    (home / "token").unlink()
    (home / "token").write_text("hf_" + "a" * 30 + "\n")
    os.chown(home / "token", 12345, 12345)
    code, out = _invoke(["plan", "--model", "org/model", "--memory", "8GiB"], env)
    assert code == 2 and "belongs to uid 12345" in out and "a" * 30 not in out


@settings(max_examples=100, deadline=None)
@given(
    secret=tokens,
    template=st.sampled_from(
        [
            "Invalid header value b'Bearer {s}'",
            "headers={{'Authorization': 'Bearer {s}'}}",
            "GET https://user:{s}@mirror.example/x failed",
            "authorization: token {s}",
            "x-api-key={s} refused",
            "ran: vllm serve m --api-key {s} --port 1",
            "HF_TOKEN={s} huggingface-cli download",
            "the value {s!r} is odd",
        ]
    ),
)
def test_the_one_redactor_removes_every_credential_shape(secret, template):
    register_secret(secret)
    message = template.format(s=secret)
    assert secret not in redact_message(message)


revisions = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        ["../..", "/etc", "main/../../x", "a//b", ".hidden", "v1.0", "main", "refs/pr/1", "x.lock"]
    ),
    st.text(alphabet="0123456789abcdef", min_size=40, max_size=40),
)


@settings(max_examples=120, deadline=None, suppress_health_check=HC)
@given(
    revision=revisions,
    ref_content=st.one_of(st.text(max_size=60), st.sampled_from(["../..", "/etc", "c" * 40])),
)
def test_revisions_and_refs_never_leave_the_cache(tmp_path_factory, revision, ref_content):
    cache = tmp_path_factory.mktemp("hub")
    repo = cache / "models--org--model"
    (repo / "snapshots" / ("c" * 40)).mkdir(parents=True)
    (repo / "snapshots" / ("c" * 40) / "config.json").write_text("{}")
    outside = cache.parent / "outside-config"
    outside.mkdir(exist_ok=True)
    (outside / "config.json").write_text("{}")
    try:
        check_revision(revision)
    except ModelFilesError as exc:
        assert "--revision" in str(exc) and len(str(exc)) < 400
        return
    assert ".." not in revision and not revision.startswith("/")
    ref = repo / "refs" / revision
    try:
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(ref_content)
    except OSError:
        return
    try:
        found = cached_snapshot("org/model", revision, {"HF_HUB_CACHE": str(cache)})
    except ModelFilesError as exc:
        assert len(str(exc)) < 600
        return
    if found is not None:
        assert found.resolve().is_relative_to(cache.resolve())


def test_a_revision_that_climbs_is_exit_2(tmp_path: Path):
    code, out = _invoke(
        ["plan", "--model", "org/model", "--revision", "../..", "--offline"], {"HF_HUB_CACHE": str(tmp_path)}
    )
    assert code == 2 and "neither a branch or tag name nor a 40-hex commit" in out


floats = st.floats(allow_nan=True, allow_infinity=True)
documents = st.recursive(
    st.none() | st.booleans() | floats | st.integers() | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(min_size=1, max_size=5), c, max_size=3),
    max_leaves=15,
)


def _no_constants(name: str):
    raise AssertionError(f"{name} in the output")


@settings(max_examples=150, deadline=None)
@given(doc=st.dictionaries(st.text(min_size=1, max_size=5), documents, max_size=4))
def test_json_output_is_strict_with_a_reason_for_every_null_it_made(doc):
    text = dumps(doc)
    parsed = json.loads(text, parse_constant=_no_constants)
    for key, value in doc.items():
        if isinstance(value, float) and not math.isfinite(value):
            assert parsed[key] is None and "not a finite number" in parsed[f"{key}_null_reason"]


@settings(max_examples=60, deadline=None)
@given(suffix=st.sampled_from(["\n", "\r\n", " ", "\x00", "/..", "\t"]))
def test_tags_are_validated_as_whole_strings(suffix):
    tag = "vllm0.22.1-rocm7.13.0-gfx1151"
    check_tag(tag, "gfx1151", "t")
    with pytest.raises(ManifestError):
        check_tag(tag + suffix, "gfx1151", "t")
    with pytest.raises(ManifestError):
        check_tag(tag + suffix + "-gfx1151", "gfx1151", "t")


@settings(max_examples=30, deadline=None, suppress_health_check=HC)
@given(
    option=st.sampled_from(
        [
            "--typical-len",
            "--max-model-len",
            "--block-size",
            "--tensor-parallel-size",
            "--max-num-batched-tokens",
        ]
    ),
    value=st.one_of(st.integers(-(2**40), 0).map(str), st.sampled_from(["1e3", "²", "", "1" * 40])),
)
def test_numeric_options_are_refused_outside_their_domain(tmp_path_factory, option, value):
    model = Path(__file__).parents[1] / "fixtures" / "model_configs" / "qwen3-8b"
    code, out = _invoke(["plan", "--model", str(model), "--memory", "8GiB", option, value], {})
    assert code == 2 and option in out and "Traceback" not in out


def test_a_negative_rope_factor_is_refused(tmp_path: Path):
    config = json.loads(
        (Path(__file__).parents[1] / "fixtures" / "model_configs" / "qwen3-8b" / "config.json").read_text()
    )
    config["rope_scaling"] = {"rope_type": "yarn", "factor": -4.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out = _invoke(["plan", "--model", str(tmp_path), "--memory", "8GiB"], {})
    assert code == 2 and "rope_scaling.factor" in out
