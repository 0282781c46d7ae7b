"""The parameter types: every bad number, port, host, path and name is exit 2 naming the option and the range.

Each case runs the real command line (a subprocess), so what is tested is what a user sees: no traceback,
no "internal error", and nothing started before the value is checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import click
import pytest

from harness.cli import rocmdoctor as run_in_process
from rocmdoctor import params

UNIT = ["unit", "--model", "m", "--gpu-memory-utilization", "0.5"]
SMOKE = ["smoke", "--url", "http://127.0.0.1:9"]
BENCH = ["bench", "--url", "http://127.0.0.1:9"]
SERVE = ["serve", "--model", "m", "--gpu-memory-utilization", "0.5"]

# command line, the option the message must name, a word of the accepted range
BAD_VALUES = [
    (["check", "--port", "99999"], "--port", "1 to 65535"),
    (["check", "--port", "-1"], "--port", "1 to 65535"),
    (["check", "--port", "80x"], "--port", "1 to 65535"),
    (["check", "--deep-timeout", "nan"], "--deep-timeout", "[1, 3600]"),
    (["check", "--deep-timeout", "inf"], "--deep-timeout", "[1, 3600]"),
    (["check", "--user", "a b"], "--user", "account name"),
    (["check", "--python", ""], "--python", "empty"),
    (["snapshot", ""], "OUT", "empty"),
    (["--root", "", "check"], "--root", "empty"),
    (SMOKE + ["--timeout", "nan"], "--timeout", "seconds in (0, 86400]"),
    (SMOKE + ["--timeout", "inf"], "--timeout", "seconds in (0, 86400]"),
    (SMOKE + ["--timeout", "-5"], "--timeout", "seconds in (0, 86400]"),
    (SMOKE + ["--timeout", "0"], "--timeout", "seconds in (0, 86400]"),
    (SMOKE + ["--timeout", "1e30"], "--timeout", "seconds in (0, 86400]"),
    (BENCH + ["--timeout", "nan"], "--timeout", "seconds in (0, 86400]"),
    (BENCH + ["--requests", "1e12"], "--requests", "from 1 to 100000"),
    (BENCH + ["--requests", "1000000000000"], "--requests", "from 1 to 100000"),
    (BENCH + ["--prompt-tokens", "1000000000"], "--prompt-tokens", "from 1 to 1048576"),
    (BENCH + ["--prompt-tokens", "1000000", "--requests", "1000"], "--prompt-tokens", "at most 16777216"),
    (BENCH + ["--concurrency", "1,2,100000"], "--concurrency", "from 1 to 1024"),
    (BENCH + ["--max-tokens", "1"], "--max-tokens", "from 2 to"),
    (SERVE + ["--timeout", "nan"], "--timeout", "seconds in (0, 604800]"),
    (SERVE + ["--timeout", "-5"], "--timeout", "seconds in (0, 604800]"),
    (SERVE + ["--host", "a b"], "--host", "not an IP address"),
    (SERVE + ["--cache-dir", ""], "--cache-dir", "empty"),
    (UNIT + ["--timeout", "1e30"], "--timeout", "whole seconds in (0, 604800]"),
    (UNIT + ["--timeout", "1.5"], "--timeout", "whole seconds"),
    (UNIT + ["--tensor-parallel-size", "0"], "--tensor-parallel-size", "from 1 to 64"),
    (["install", "--connect-timeout", "0"], "--connect-timeout", "seconds in (0, 600]"),
    (["install", "--connect-timeout", "nan"], "--connect-timeout", "seconds in (0, 600]"),
    (["install", "--read-timeout", "-1"], "--read-timeout", "seconds in (0, 3600]"),
    (["install", "--read-timeout", "inf"], "--read-timeout", "seconds in (0, 3600]"),
    (["install", "--retries", "-1"], "--retries", "from 0 to 100"),
    (["install", "--download-dir", ""], "--download-dir", "empty"),
    (["bundle", "fetch", "--to", ""], "--to", "empty"),
]


def rocmdoctor(*argv: str) -> subprocess.CompletedProcess:
    return run_in_process(*argv)


@pytest.mark.parametrize(
    ("argv", "option", "accepted"), BAD_VALUES, ids=lambda v: " ".join(v) if isinstance(v, list) else None
)
def test_a_bad_value_is_exit_2_naming_the_option_and_the_range(argv, option, accepted):
    started = time.monotonic()
    done = rocmdoctor(*argv)
    assert done.returncode == 2, done.stdout + done.stderr
    assert option in done.stderr and accepted in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert time.monotonic() - started < 30


# -- the types themselves ------------------------------------------------------------------------------


def convert(kind: click.ParamType, value: str):
    return kind.convert(value, None, None)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-5", "1e30", "", "x", "1e400"])
def test_duration_refuses_what_is_not_a_finite_positive_bounded_number(value):
    with pytest.raises(click.BadParameter):
        convert(params.Duration(max_s=3600), value)


def test_duration_accepts_the_range_and_whole_seconds_stay_whole():
    assert convert(params.Duration(max_s=3600), "0.5") == 0.5
    assert convert(params.Duration(max_s=3600), "3600") == 3600.0
    assert convert(params.Duration(whole=True), "1800") == 1800
    assert convert(params.Duration(min_s=1, inclusive=True, max_s=10), "1") == 1.0


@pytest.mark.parametrize("value", ["0", "65536", "-1", "1e3", "80.0", " ", "0x50"])
def test_port_is_1_to_65535_in_digits(value):
    with pytest.raises(click.BadParameter):
        convert(params.Port(), value)


@pytest.mark.parametrize("value", ["127.0.0.1", "0.0.0.0", "::", "::1", "gpu01.example.org", "localhost"])
def test_host_names_and_addresses_pass(value):
    assert convert(params.HostName(), value) == value


@pytest.mark.parametrize("value", ["a b", "", "-x", "host;rm", "a..b", "x" * 300, "h\n"])
def test_bad_hosts_are_refused(value):
    with pytest.raises(click.BadParameter):
        convert(params.HostName(), value)


@pytest.mark.parametrize("value", ["0.004", "0", "1.01", "nan", "-0.5", "inf"])
def test_fraction_keeps_to_its_range(value):
    with pytest.raises(click.BadParameter):
        convert(params.Fraction(0.01), value)


def test_prefix_is_normalised():
    assert convert(params.Prefix(), "/opt//rd/") == "/opt/rd"


def test_an_empty_prefix_variable_is_an_error_not_the_default():
    done = subprocess.run(
        [sys.executable, "-m", "rocmdoctor", "bundles"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "ROCMDOCTOR_PREFIX": ""},
    )
    assert done.returncode == 2 and "ROCMDOCTOR_PREFIX is set but empty" in done.stderr


@pytest.mark.parametrize("metadata", ["[1, 2]", "null", '"tag"', "{not json"])
def test_bundle_metadata_that_is_not_an_object_is_an_incomplete_bundle(tmp_path, metadata):
    tag = "vllm0.20.1-rocm7.12.0-gfx1151"
    bundle = tmp_path / "bundles" / tag
    bundle.mkdir(parents=True)
    (bundle / ".rocmdoctor-bundle.json").write_text(metadata)
    listed = rocmdoctor("bundles", "--prefix", str(tmp_path), "--json")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr
    assert [b["complete"] for b in json.loads(listed.stdout)["bundles"]] == [False]
    rolled = rocmdoctor("rollback", "--prefix", str(tmp_path), "--to", tag)
    assert rolled.returncode == 1 and "not a complete bundle" in rolled.stderr
    assert not (tmp_path / "current").exists()
