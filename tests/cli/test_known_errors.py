"""An error the user can act on is a clear exit 2 with what to do, from every command, never "internal
error": every exception class rocmdoctor defines is either one the CLI maps (cli.KNOWN_ERRORS: its
message, then the advice) or listed below as internal control flow that never leaves its command; and
the mapping holds wherever a command lets one through."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import rocmdoctor
import rocmdoctor.checks
import rocmdoctor.provision
from rocmdoctor.cli import KNOWN_ERRORS, LazyGroup, cli, known_error

# Raised and caught inside one module (a step's outcome, a cancellation, a retry); each never reaches
# the command line, which the CLI tests of its command show.
INTERNAL = {
    "rocmdoctor.host_processes.Stopped": "a signal during a run: the command stops its group and exits",
    "rocmdoctor.provision.verify.smoke.StepFailed": "a smoke step's failure, reported as its result",
    "rocmdoctor.provision.verify.bench.BenchAborted": "ends a bench level; reported in bench's document",
    "rocmdoctor.provision.verify.instances_bench.InstanceAborted": "the same, per instance",
    "rocmdoctor.provision.verify.openai_client.ServerError": "a server's answer, reported as a step",
    "rocmdoctor.provision.bundle.download.StreamRestarted": "a download's retry",
    "rocmdoctor.provision.bundle.download.StreamCancelled": "a download's cancellation",
    "rocmdoctor.provision.bundle.download.DownloadCancelled": "a download's cancellation",
    "rocmdoctor.provision.server.wait_ready.NotReady": "the standalone ExecStartPost's own exit",
    "rocmdoctor.provision.bundle.download._Retryable": "a download's retry",
    "rocmdoctor.provision.verify.health._Answer": "the health probe's verdict, reported in the textfile",
    "rocmdoctor.commands.bench_plot.PlotUnavailable": "bench's plot is skipped with a note",
    "rocmdoctor.archive.tar_rule.ArchiveError": "the extractors' failure, wrapped by install and snapshot",
    "rocmdoctor.archive.tar_rule.NoSpaceLeft": "an OSError: mapped with its file and reason",
    "rocmdoctor.rootfs.NotRegularFile": "an OSError: mapped with its file and reason",
    "rocmdoctor.rootfs.FileTooLarge": "an OSError: mapped with its file and reason",
    "rocmdoctor.host_sockets.ListenError": "an OSError: mapped with its file and reason",
    "rocmdoctor.provision.bounded_http.HttpError": "each client turns it into its own error",
    "rocmdoctor.provision.verify.memory.MetricsError": "plan and lemonade report it as a finding",
    "rocmdoctor.provision.verify.prometheus.MetricsFormatError": "reported as a finding",
    "rocmdoctor.provision.verify.openai_schema.ShapeError": "a smoke step's failure",
    "rocmdoctor.provision.verify.context_probe.CannotJudge": "the context step's skip, with the reason",
    "rocmdoctor.commands.explain_input.InputError": "explain's refusal of a log: exit 2 with its message",
    "rocmdoctor.provision.bundle.upgrade._GateFailed": "a failed gate: the host is rolled back and reported",
    "rocmdoctor.provision.bundle.upgrade_plan.BaselineError": "a damaged baseline: upgrade exits 1 naming it",
    "rocmdoctor.vllm.log_signatures.TableError": "the package's own signature table, checked by its tests",
    "rocmdoctor.provision.bundle.github_release.ReleaseError": "install reports it with its remedy",
    "rocmdoctor.provision.bundle.download.DownloadError": "install reports it with its remedy",
    "rocmdoctor.provision.bundle.qualify.NotQualified": "install reports it with the qualification",
    "rocmdoctor.provision.tune.session.Unfit": "tune reports the setting as not fitting",
    "rocmdoctor.provision.server.lemonade_args.ProtectedFlagError": "wrapped as a LemonadeError",
    "rocmdoctor.registry.RegistryError": "a check declaration's bug, caught by the conformance tests",
}


def _classes() -> dict[str, type[BaseException]]:
    found = {}
    infos = [
        *pkgutil.walk_packages(rocmdoctor.__path__, "rocmdoctor."),
        *pkgutil.walk_packages(rocmdoctor.provision.__path__, "rocmdoctor.provision."),
        *pkgutil.walk_packages(rocmdoctor.checks.__path__, "rocmdoctor.checks."),
    ]
    for info in infos:
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and cls.__module__ == info.name:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


CLASSES = _classes()


def _covered(cls: type[BaseException], table: dict[str, str]) -> bool:
    return any(f"{c.__module__}.{c.__qualname__}" in table for c in cls.__mro__)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_error_class_is_mapped_or_internal(name):
    cls = CLASSES[name]
    if issubclass(cls, click.ClickException):
        return  # click shows it itself (UserError: exit 2)
    assert _covered(cls, KNOWN_ERRORS) or _covered(cls, INTERNAL) or issubclass(cls, OSError), (
        f"{name}: add it to cli.KNOWN_ERRORS with what to do, or to INTERNAL here with why it never escapes"
    )


def test_every_mapped_name_is_a_class_that_exists():
    assert set(KNOWN_ERRORS) <= set(CLASSES), set(KNOWN_ERRORS) - set(CLASSES)
    assert set(INTERNAL) <= set(CLASSES), set(INTERNAL) - set(CLASSES)


def _instance(cls: type[BaseException]) -> BaseException:
    exc = cls.__new__(cls)
    Exception.__init__(exc, "the-message-of-the-error")
    return exc


class _Raising(LazyGroup):
    """The real group, with one command that raises the error under test where a command's code would."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(name="rocmdoctor")
        self.exc = exc

    def get_command(self, ctx, cmd_name):
        @click.command(cmd_name)
        def boom() -> None:
            raise self.exc

        return boom


@pytest.mark.parametrize("name", sorted(KNOWN_ERRORS))
def test_a_known_error_from_a_command_is_exit_2_with_what_to_do(name):
    result = CliRunner().invoke(_Raising(_instance(CLASSES[name])), ["anything"])
    out = result.stdout + result.stderr
    assert result.exit_code == 2, out
    assert "the-message-of-the-error" in out and "internal error" not in out and "Traceback" not in out
    if KNOWN_ERRORS[name]:
        assert KNOWN_ERRORS[name] in out


def test_an_os_error_says_its_file_and_reason():
    exc = PermissionError(13, "Permission denied", "/etc/default/grub")
    assert known_error(exc) == "/etc/default/grub: Permission denied (run as root, or as the owner)"
    assert known_error(RuntimeError("a bug")) is None


def test_a_bug_is_still_an_internal_error():
    result = CliRunner().invoke(_Raising(RuntimeError("a bug")), ["anything"])
    assert isinstance(result.exception, RuntimeError)


def run(*args: str):
    return CliRunner().invoke(cli, list(args), env={"ROCMDOCTOR_ROOT": "", "ROCMDOCTOR_URL": ""})


COMMANDS_READING_THE_ROOT = [
    ("check",),
    ("fix", "--check"),
    ("fix-kernel",),
    ("instances",),
    ("lemonade", "check"),
    ("cluster", "facts"),
    ("snapshot", "OUT.tar.gz"),
    ("unit", "--model", "m"),
    ("serve", "--model", "m", "--with-root-facts"),
    ("instances", "--model", "m"),
    ("tune", "--model", "m"),
    ("install", "--family", "auto", "--with-root-facts", "--check"),
    ("lemonade", "apply", "--check"),
    ("lemonade", "verify"),
    ("lemonade", "install-backend", "--check"),
]


@pytest.mark.parametrize("args", COMMANDS_READING_THE_ROOT, ids=" ".join)
@pytest.mark.parametrize("root", ["missing", "file", "link"])
def test_a_bad_root_is_exit_2_from_every_command(tmp_path, args, root):
    path = tmp_path / "root"
    if root == "file":
        path.write_text("not a directory, not a snapshot")
    elif root == "link":
        path.symlink_to(tmp_path / "nowhere")
    result = run("--root", str(path), *args)
    out = result.stdout + result.stderr
    assert result.exit_code == 2, out
    assert "internal error" not in out and "Traceback" not in out and str(path) in out


@pytest.mark.parametrize("args", [("fix", "--check"), ("fix-kernel", "--check")], ids=" ".join)
def test_a_target_that_is_no_directory_is_exit_2(tmp_path, args):
    target = tmp_path / "target"
    target.write_text("a file")
    result = run(*args, "--target", str(target))
    out = result.stdout + result.stderr
    assert result.exit_code == 2 and "internal error" not in out, out


@pytest.mark.parametrize(
    "url", ["http://\udcff/", "http://\x00/", "ftp://h/", "http://h:99999/", "http:// h/"]
)
@pytest.mark.parametrize("command", [("smoke",), ("bench",), ("lemonade", "check")], ids=" ".join)
def test_a_url_that_is_no_server_url_is_exit_2(command, url):
    result = run(*command, "--url", url)
    out = result.stdout + result.stderr
    assert result.exit_code == 2 and "Invalid value for '--url'" in out, out


@pytest.mark.parametrize("slo", ["", "   "])
def test_an_empty_slo_is_refused(slo):
    result = run("tune", "--model", "m", "--slo", slo)
    assert result.exit_code == 2 and "--slo" in result.output and "is empty" in result.output, result.output


def test_root_tree_is_not_touched(tmp_path: Path):
    assert not any(tmp_path.iterdir())  # the tests above write nothing outside their own tmp_path


@pytest.mark.parametrize("port", ["9" * 5000, "²", "0", "65536", "-1", ""])
def test_a_peer_port_that_is_no_port_is_exit_2(port):
    result = run("cluster", "probe", "--name", "a", "--peer", f"b=127.0.0.1:{port}")
    out = result.stdout + result.stderr
    assert result.exit_code == 2 and "--peer" in out and "9" * 300 not in out, out
