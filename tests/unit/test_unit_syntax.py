"""Every field of every unit rocmdoctor writes, with hostile values: refused (UnitError) or written so
that no line and no setting appears (provision/server/unit_syntax.py). That systemd reads back exactly
the value is shown by tests/system/test_unit_syntax_systemd.py under the real systemd."""

from __future__ import annotations

import shlex

import pytest

from harness.cli import rocmdoctor
from harness.hostile_units import CONTROL, FIELDS, INJECTIONS, PRINTABLE, TRAILING_BACKSLASH
from rocmdoctor.provision.server import unit_syntax
from rocmdoctor.provision.server.unit import UnitError


def settings(unit: str) -> list[str]:
    """The unit's setting lines (systemd.syntax: comments and sections aside)."""
    return [ln.split("=", 1)[0] for ln in unit.splitlines() if ln and not ln.startswith(("#", ";", "["))]


@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize("value", CONTROL, ids=["newline", "carriage-return", "nul", "tab"])
def test_control_characters_are_refused_in_every_field(field, value):
    with pytest.raises(UnitError):
        FIELDS[field](value)


@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize(
    "value",
    [PRINTABLE, TRAILING_BACKSLASH, *INJECTIONS],
    ids=["printable", "trailing-backslash", "newline-exec", "space-env", "quote-env"],
)
def test_no_value_adds_a_line_or_a_setting(field, value):
    plain = FIELDS[field]("plain")
    try:
        hostile = FIELDS[field](value)
    except UnitError as exc:
        assert str(exc)  # refused, saying why
        return
    assert hostile.keys() == plain.keys()
    for name, unit in hostile.items():
        assert settings(unit) == settings(plain[name]), name
        # No assignment besides those of the plain unit: a value never splits into a new variable.
        assert assigned(unit) == assigned(plain[name]), name


def assigned(unit: str) -> list[list[str]]:
    """The names each Environment= line assigns (its words unquoted as systemd.exec(5) does)."""
    lines = [ln[len("Environment=") :] for ln in unit.splitlines() if ln.startswith("Environment=")]
    return [[word.split("=", 1)[0] for word in shlex.split(line)] for line in lines]


@pytest.mark.parametrize(
    ("word", "written"),
    [
        ("plain", "plain"),
        ("a b", '"a b"'),
        ("50%", "50%%"),
        ("$HOME", "$$HOME"),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        (";", '";"'),
        ("", '""'),
    ],
)
def test_exec_words_follow_systemd_quoting(word, written):
    assert unit_syntax.exec_word(word) == written


def test_environment_assignments_are_quoted_whole():
    assert unit_syntax.assignment("A", "1") == "A=1"
    assert unit_syntax.assignment("A", "x y") == '"A=x y"'
    assert unit_syntax.assignment("A", '5% "q" \\') == '"A=5%% \\"q\\" \\\\"'
    with pytest.raises(UnitError):
        unit_syntax.assignment("A B", "1")


@pytest.mark.parametrize("value", ["eth0", "enp1s0f0", "eth0,eth1", "^docker,lo", "=ib0", "br-lan.100"])
def test_interface_names(value):
    assert unit_syntax.ifname_problem(value) is None


@pytest.mark.parametrize("value", [*INJECTIONS, "", "eth0 ", "a/b", "eth:0", "x" * 16, "..", "eth0,^lo"])
def test_interface_names_refused(value):
    assert unit_syntax.ifname_problem(value)


@pytest.mark.parametrize("value", INJECTIONS)
def test_cluster_unit_refuses_a_hostile_socket_ifname_with_exit_2(value, tmp_path):
    argv = ["cluster", "unit", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1"]
    argv += ["--advertise", "10.0.0.2", "--socket-ifname", value, "--model", str(tmp_path)]
    result = rocmdoctor(*argv)
    assert result.returncode == 2, result.stderr
    assert "--socket-ifname" in result.stderr and "Traceback" not in result.stderr
