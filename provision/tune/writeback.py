"""Where `rocmdoctor tune` writes its winner: a drop-in beside the server's unit.

`unit --write` and `instances --write` own their unit files (a rerun rewrites them), so tune writes
`<unit>.d/rocmdoctor-tune.conf`, which systemd reads after the unit (systemd.unit, "drop-in"): it
empties ExecStart= and sets it again to the unit's own command line with --max-num-seqs and
--max-num-batched-tokens replaced. The command line is read from the unit as installed (never
recomputed), so every other argument stays exactly as `unit` wrote it; for `vllm@.service` the
per-instance `${...}` references stay references. `vllm@N` gets its own drop-in
(`vllm@N.service.d/`), so one instance can be tuned apart from the others.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from rocmdoctor.host_writes import HostWriter, WriteRefused
from rocmdoctor.model import Change
from rocmdoctor.provision.server.args import flag_meanings
from rocmdoctor.provision.server.unit import (
    UNIT_DIR,
    UNIT_NAME,
    FileChange,
    FileSpec,
    UnitError,
    WriteReport,
    apply_file,
)
from rocmdoctor.provision.server.unit import daemon_reload as reload_units
from rocmdoctor.provision.server.unit_syntax import Verbatim, exec_start_dropin
from rocmdoctor.provision.tune.search import Setting
from rocmdoctor.vllm.surface import Surface, judge_flag

DROPIN_NAME = "rocmdoctor-tune.conf"
TEMPLATE_NAME = "vllm@.service"  # instances.TEMPLATE_NAME (kept apart: instances imports the layout)
MAX_UNIT_BYTES = 256 << 10
_REFERENCE = re.compile(r"\$\{\w+\}")
TUNED_FLAGS = ("--max-num-seqs", "--max-num-batched-tokens")


class WritebackError(ValueError):
    """The winner cannot be written where asked; the message says what to do."""


def unit_names(instance: str | None) -> tuple[str, str]:
    """(the unit file that holds ExecStart=, the unit whose drop-in directory tune writes)."""
    if instance is None:
        return UNIT_NAME, UNIT_NAME
    if not re.fullmatch(r"[0-9]{1,4}", instance):
        raise WritebackError(f"instance {instance!r}: give the number of a vllm@N instance")
    return TEMPLATE_NAME, f"vllm@{instance}.service"


def exec_start(unit_text: str, unit_path: str) -> list[str]:
    """The words of the unit's one ExecStart= line (systemd's quoting: shell-like, `%%` and `$$` doubled)."""
    lines = [line for line in unit_text.splitlines() if line.startswith("ExecStart=")]
    if len(lines) != 1 or not lines[0][len("ExecStart=") :].strip():
        raise WritebackError(
            f"{unit_path} has {len(lines)} ExecStart= lines, not the one `rocmdoctor unit --write` writes; "
            "rewrite it with `rocmdoctor unit --write` (or `instances --write`) and rerun tune"
        )
    try:
        words = shlex.split(lines[0][len("ExecStart=") :], posix=True)
    except ValueError as exc:
        raise WritebackError(f"{unit_path}: ExecStart= cannot be read ({exc})") from None
    return [w if _REFERENCE.fullmatch(w) else w.replace("%%", "%").replace("$$", "$") for w in words]


def without_tuned(argv: list[str]) -> list[str]:
    """`argv` without the tuned flags, in either spelling (`--flag V` or `--flag=V`)."""
    out: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        flag, eq, _ = word.partition("=")
        if flag in TUNED_FLAGS:
            skip = not eq
            continue
        out.append(word)
    return out


def with_setting(argv: list[str], setting: Setting) -> list[str]:
    """`argv` with the tuned flags replaced by `setting`'s."""
    out = without_tuned(argv)
    # Before the first ${...} reference: the template's per-instance words stay last.
    at = next((i for i, w in enumerate(out) if _REFERENCE.fullmatch(w)), len(out))
    if 0 < at < len(out) and out[at - 1].startswith("-"):
        at -= 1  # the reference is a flag's value: before the flag
    return out[:at] + setting.flags() + out[at:]


@dataclass
class DropinReport(WriteReport[FileChange]):
    """The drop-in's write, with what the bundle's vLLM said of its command line: the notes (a renamed
    flag translated, a deprecated one) and which vLLM judged it (its own record or a shipped table)."""

    notes: list[str] = field(default_factory=list)
    vllm: str | None = None

    def change(self) -> Change:
        change = super().change()
        change.data["notes"] = list(self.notes)
        change.data["vllm"] = self.vllm
        return change


def validated(argv: list[str], vllm: Surface) -> tuple[list[str], list[str]]:
    """The unit's command line for the vLLM that will run it (the bundle's record, or its version's
    shipped table): a renamed flag translated with a note, a deprecated one noted; a flag that vLLM does
    not know refuses the write (WritebackError naming the version), since the unit would not start.
    Values and ${...} references are left as they are; only words that are flags are judged."""
    out = list(argv)
    notes: list[str] = []
    problems: list[str] = []
    for index, word in enumerate(argv[1:], 1):
        if not word.startswith("--") or _REFERENCE.fullmatch(word) or word == "--":
            continue
        spelled, eq, value = word.partition("=")
        meanings = flag_meanings(spelled, vllm.lengths)
        flag = next(iter(meanings)) if len(meanings) == 1 else "--" + spelled[2:].replace("_", "-")
        verdict = judge_flag(vllm, flag)
        if verdict.refusal:
            problems.append(verdict.refusal)
            continue
        if verdict.note and verdict.note not in notes:
            notes.append(verdict.note)
        if verdict.name != flag:
            out[index] = verdict.name + eq + value
    if problems:
        raise WritebackError(
            "the unit's command line does not fit the installed bundle: "
            + "; ".join(problems)
            + ". Rewrite the unit for this bundle (`rocmdoctor unit --write`, or `instances --write`) and rerun tune"
        )
    return out, notes


def render_dropin(argv: list[str], setting: Setting, why: str) -> str:
    words: list[str | Verbatim] = [Verbatim(w) if _REFERENCE.fullmatch(w) else w for w in argv]
    return exec_start_dropin(
        "Written by `rocmdoctor tune`: the measured best setting; rerun tune rather than editing this",
        "file. " + re.sub(r"[\x00-\x1f\x7f]", " ", why),
        words,
    )


def installed_exec_start(writer: HostWriter, instance: str | None, unit_dir: str = UNIT_DIR) -> list[str]:
    """The ExecStart= words of the unit tune would write beside; WritebackError when there is none (tune
    asks before it measures anything, and again when it writes)."""
    source, _ = unit_names(instance)
    unit_path = f"{unit_dir}/{source}"
    try:
        raw = writer.read_current(unit_path, MAX_UNIT_BYTES)
    except (WriteRefused, OSError) as exc:
        raise WritebackError(f"{writer.root / unit_path.lstrip('/')}: {exc}") from None
    if raw is None:
        command = "rocmdoctor unit --write" if instance is None else "rocmdoctor instances --write"
        raise WritebackError(
            f"{writer.root / unit_path.lstrip('/')} does not exist: the server is not configured as a unit "
            f"there; write it first (`{command}`), or leave --write out to only see the result"
        )
    return exec_start(raw.decode(errors="replace"), unit_path)


def dropin_spec(
    writer: HostWriter,
    instance: str | None,
    setting: Setting,
    why: str,
    unit_dir: str = UNIT_DIR,
    vllm: Surface | None = None,
    notes: list[str] | None = None,
) -> FileSpec:
    """The drop-in; with `vllm`, its command line validated for that vLLM (notes appended to `notes`)."""
    _, target = unit_names(instance)
    argv = with_setting(installed_exec_start(writer, instance, unit_dir), setting)
    if vllm is not None:
        argv, said = validated(argv, vllm)
        if notes is not None:
            notes.extend(said)
    return FileSpec(f"{unit_dir}/{target}.d/{DROPIN_NAME}", render_dropin(argv, setting, why), 0o644)


def write_back(
    writer: HostWriter, instance: str | None, setting: Setting, why: str, vllm: Surface | None = None
) -> DropinReport:
    """Make the drop-in hold `setting` (a writer in check mode only reports, with the diff). `vllm`: the
    installed bundle's (ask_vllm.for_prefix), which the command line is validated against."""
    report = DropinReport(check=writer.check_mode, vllm=vllm.described() if vllm is not None else None)
    try:
        spec = dropin_spec(writer, instance, setting, why, vllm=vllm, notes=report.notes)
        report.files = [apply_file(writer, spec)]
        if report.changed:
            report.daemon_reload = reload_units(writer)
    except (WriteRefused, UnitError) as exc:
        raise WritebackError(str(exc)) from None
    return report
