"""Global options work before or after the subcommand, and bad ones are refused with exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import HOSTS

FIXTURE = str(HOSTS / "strix-halo-nocwsr-dkms")


def rocmdoctor(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rocmdoctor", *args], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.parametrize(
    "args",
    [
        ("check", "--root", FIXTURE, "-v"),
        ("-v", "check", "--root", FIXTURE),
        ("--root", FIXTURE, "check", "-v"),
        ("check", "-v", "--root", FIXTURE, "--no-color"),
    ],
)
def test_global_options_anywhere_give_the_same_report(args):
    reference = rocmdoctor("-v", "--root", FIXTURE, "check")
    got = rocmdoctor(*args)
    assert reference.returncode == 1
    assert (got.returncode, got.stdout) == (reference.returncode, reference.stdout)


def test_root_after_the_subcommand_overrides_the_group_default():
    report = rocmdoctor("check", "--json", "--root", FIXTURE)
    assert '"root": "' + str(HOSTS / "strix-halo-nocwsr-dkms") in report.stdout


@pytest.mark.parametrize("args", [("--root", "", "check"), ("check", "--root", "")])
def test_empty_root_is_refused(args):
    proc = rocmdoctor(*args)
    assert proc.returncode == 2
    assert "--root" in proc.stderr and "empty" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_option_is_an_error_not_a_suggestion_of_a_global():
    proc = rocmdoctor("check", "--rooot", FIXTURE)
    assert proc.returncode == 2
    assert "No such option" in proc.stderr


@pytest.mark.parametrize(
    "short, long", [("install", "install"), ("rollback", "rollback"), ("bundles", "list")]
)
def test_bundle_group_holds_every_bundle_command_and_the_short_forms_stay(short, long):
    top = rocmdoctor(short, "--help")
    grouped = rocmdoctor("bundle", long, "--help")
    assert top.returncode == grouped.returncode == 0
    assert top.stdout.split("Options:", 1)[1] == grouped.stdout.split("Options:", 1)[1]


def test_global_options_after_a_grouped_subcommand(tmp_path):
    listed = rocmdoctor("bundle", "list", "--prefix", str(tmp_path / "none"), "--json", "--root", FIXTURE)
    assert listed.returncode == 0, listed.stderr
    assert not (tmp_path / "none").exists()
