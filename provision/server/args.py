"""The vLLM server's command line, resolved in one place from host facts and the user's choices.

`unit` and `serve` both call `resolve()`: what runs in the foreground and what systemd runs are
the same arguments. Every computed flag carries the reason it has its value, so a user can see
why `--gpu-memory-utilization 0.87` and not vLLM's default 0.92.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rocmdoctor.facts.vendor_advice import server_environment
from rocmdoctor.params import host_problem, name_problem
from rocmdoctor.provision.server.plan_settings import PlannedSettings
from rocmdoctor.vllm.flags import FLAGS, VLLM_VERSION
from rocmdoctor.vllm.memory_rule import MIN_USEFUL_UTILIZATION, recommended, requested_bytes
from rocmdoctor.vllm.surface import Surface, judge_all, judge_flag, judge_variable

GIB = 1 << 30
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000

# --max-num-seqs per memory class. A Strix Halo owner measured throughput collapse with vLLM's
# default (256) on the unified pool until --max-num-seqs 10; discrete cards keep vLLM's own
# defaults (256 below 70 GiB, 1024 above: RocmPlatform's server defaults).
MAX_NUM_SEQS_BY_CLASS = {"unified": 10, "discrete": 256, "discrete-large": 1024}
LARGE_DEVICE_BYTES = 70 * GIB

# Flags rocmdoctor computes, with the option the user sets them through instead. A pass-through word
# that vLLM could read as one of these (any spelling: --por, --port=1, -tp, --max_num_seqs) is refused:
# readiness would poll the computed port while vLLM listens on another.
COMPUTED_FLAGS = {
    "--model": "--model",
    "--served-model-name": "--served-model-name",
    "--host": "--host",
    "--port": "--port",
    "--gpu-memory-utilization": "--gpu-memory-utilization",
    "--max-model-len": "--max-model-len",
    "--max-num-seqs": "--max-num-seqs",
    "--tensor-parallel-size": "--tensor-parallel-size",
}
# Flags that are never passed through, with what to do instead.
REFUSED_FLAGS = {
    "--api-key": "a key on the command line is visible to every user in the process list and in the unit "
    "file; write the key to a file (mode 0600) and pass --api-key-file FILE (vLLM reads VLLM_API_KEY)",
    "--hf-token": "a token on the command line is visible to every user in the process list and in the unit "
    "file; give the server HF_TOKEN in its environment (or log in as its user with `hf auth login`)",
    "--config": "a vLLM config file can set the port, host, model and key behind rocmdoctor's back; pass "
    "those settings as rocmdoctor options and the rest after --",
    "--uds": "the server would listen on a Unix socket while readiness polls host:port",
    "--headless": "a headless server has no API for readiness to poll",
    "--help": "it prints vLLM's help and exits; run `<prefix>/current/bin/vllm-server --help` instead",
}
# With an explicit KV cache size vLLM ignores --gpu-memory-utilization; computing it is moot.
UTILIZATION_REPLACED_BY = ("--kv-cache-memory-bytes",)
# The value is written with two decimals: anything below 0.01 would reach vLLM as 0.00.
MIN_SETTABLE_UTILIZATION = 0.01
NEGATIVE_NUMBER = re.compile(r"-\d+(\.\d*)?([eE][+-]?\d+)?")


class ArgumentError(ValueError):
    """The user's choices cannot be turned into a working command line; the message says why."""


@dataclass(frozen=True, slots=True)
class GpuPool:
    """What vLLM will see for one GPU: the pool it sizes from and what is free in it."""

    name: str  # e.g. "node 1 (gfx1151)"
    family: str  # same-family GPUs can share a tensor-parallel group
    total: int | None  # None: the host did not say
    free: int | None
    unified: bool  # APU: the pool is system memory (GTT), shared with the CPU
    gfx: str | None = None  # its ISA (e.g. gfx942); None: the family names it


@dataclass
class Choices:
    """What the user asked for; None means "compute it"."""

    model: str
    served_model_name: str | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    tensor_parallel_size: int | None = None
    extra: Sequence[str] = ()
    # The vLLM the arguments are for (vllm/surface.py): the installed bundle's own answer, or the shipped
    # table of its version. None: rocmdoctor's own list (FLAGS), unknown flags passed with a note.
    vllm: Surface | None = None
    serving: Any = None  # plan_settings.ServingVersion: the vLLM whose rules size the plan (None: newest)


@dataclass(frozen=True, slots=True)
class Setting:
    flag: str
    value: str
    reason: str


@dataclass
class ServerArgs:
    settings: list[Setting]
    extra: list[str]
    notes: list[str] = field(default_factory=list)
    # Set for the server besides the bundle's own settings: ROCR_VISIBLE_DEVICES pins its GPUs.
    environment: dict[str, str] = field(default_factory=dict)
    # The model's memory plan (model_plan.ModelPlan) the settings came from; None without one.
    plan: Any = None

    @property
    def served_model_name(self) -> str:
        return self.value("--served-model-name") or ""

    @property
    def port(self) -> int:
        return int(self.value("--port") or DEFAULT_PORT)

    @property
    def host(self) -> str:
        return self.value("--host") or DEFAULT_HOST

    def value(self, flag: str) -> str | None:
        return next((s.value for s in self.settings if s.flag == flag), None)

    def argv(self) -> list[str]:
        out: list[str] = []
        for setting in self.settings:
            out += [setting.flag, setting.value]
        return out + list(self.extra)

    def to_json(self) -> dict:
        return {
            "argv": self.argv(),
            "settings": [{"flag": s.flag, "value": s.value, "reason": s.reason} for s in self.settings],
            "extra": list(self.extra),
            "environment": dict(self.environment),
            "notes": list(self.notes),
        }


def parse_extra(extra: str | Iterable[str]) -> list[str]:
    """Extra vLLM arguments as argv: a string is split like a POSIX shell would, but never run by one."""
    if isinstance(extra, str):
        try:
            return shlex.split(extra)
        except ValueError as exc:
            raise ArgumentError(f"cannot split the extra vLLM arguments ({exc}); check the quotes") from None
    return list(extra)


def flag_meanings(token: str, table: Mapping[str, tuple[str, int]] = FLAGS) -> set[str]:
    """Every vLLM flag (its long name) that vLLM's parser could read `token` as; empty for a value.

    vLLM's FlexibleArgumentParser rewrites `_` to `-` in long names and reads `--name.key value` as
    `--name '{"key": value}'` and `-O3` as `--optimization-level 3`; then argparse (allow_abbrev) matches
    an exact option, `--flag=value`, any prefix of long options, a short option with its value attached
    (`-qfp8`) and any prefix of multi-letter short options (`-t` for `-tp`). Several candidates make vLLM
    refuse the word as ambiguous; they are all returned, so a caller can refuse any that is dangerous.
    """
    if not token.startswith("-") or token in ("-", "--") or NEGATIVE_NUMBER.fullmatch(token):
        return set()
    if token.startswith("-O") and not token.startswith("--"):
        return {table["--optimization-level"][0]}
    name = token.split("=", 1)[0].split(".", 1)[0]
    if token.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    if name in table:
        return {table[name][0]}
    if token.startswith("--"):
        candidates = [option for option in table if option.startswith(name)]
    else:
        # argparse matches single-dash words whole ("-a=1" is no prefix of "-ac"); a dotted key reaches it
        # without its value.
        seen = name if "." in token.split("=", 1)[0] else token
        candidates = [option for option in table if not option.startswith("--") and option.startswith(seen)]
        if seen[:2] in table:
            candidates.append(seen[:2])
    return {table[option][0] for option in candidates}


@dataclass
class ExtraCheck:
    flags: list[str]  # long names of the vLLM flags the words set
    notes: list[str]
    words: list[str] = field(default_factory=list)  # the words to write (a renamed flag translated)


def inspect_extra(extra: Sequence[str], vllm: Surface | None = None) -> ExtraCheck:
    """Refuse secrets on the command line, flags rocmdoctor computes and words vLLM would take as the model.

    Every word is classified with vLLM's own rules (flag_meanings); a word that could mean a refused or
    computed flag is refused even when vLLM would also find it ambiguous. A flag unknown to the vLLM
    version the list comes from is passed with a note (a newer bundle may know it).

    With `vllm` (the bundle's own answer or its version's shipped table) the words are read with that
    version's parser: a renamed flag is translated with a note, a deprecated one noted, and an unknown
    one refused naming the version (and the first shipped version that has it).
    """
    table = vllm.lengths if vllm is not None else FLAGS
    problems: list[str] = []
    flags: list[str] = []
    notes: list[str] = []
    words: list[str] = []
    takes = 0  # how many following words the last flag may still take as its value (-1: any number)
    for token in extra:
        words.append(token)
        shown = token.split("=", 1)[0]  # never echo a value: it may be the secret
        if token == "--":
            raise ArgumentError(
                "a second `--` among the vLLM arguments: vLLM would read every word after it "
                "as the model; remove it"
            )
        meanings = flag_meanings(token, table)
        if not meanings and vllm is not None and token.startswith("--") and " " not in shown:
            verdict = judge_flag(vllm, "--" + shown[2:].replace("_", "-"))
            if verdict.refusal:
                problems.append(verdict.refusal)
                takes = -1
                continue
            if verdict.note:
                notes.append(verdict.note)
                words[-1] = verdict.name + token[len(shown) :]
                meanings = flag_meanings(words[-1], table)
        if not meanings:
            # argparse reads an unmatched "-word" as an option, unless it is a number or holds a space.
            if (
                token.startswith("-")
                and token != "-"
                and not NEGATIVE_NUMBER.fullmatch(token)
                and " " not in token
            ):
                what = vllm.described() if vllm is not None else f"vLLM {VLLM_VERSION} (rocmdoctor's list)"
                notes.append(f"{shown} is not a flag of {what}; vLLM may refuse it")
                takes = -1
            elif takes == 0:
                problems.append(
                    f"{token!r} is not the value of any flag, so vLLM would read it as the model "
                    "to serve; rocmdoctor sets the model with --model (quote values that hold "
                    "spaces, and check the flag before it)"
                )
            elif takes > 0:
                takes -= 1
            continue
        for flag in sorted(meanings):
            spelled = shown if shown == flag else f"{shown} (vLLM reads it as {flag})"
            if flag in REFUSED_FLAGS:
                raise ArgumentError(f"{spelled} is refused: {REFUSED_FLAGS[flag]}")
            if flag in COMPUTED_FLAGS:
                problems.append(
                    f"{spelled} is computed by rocmdoctor; set it with rocmdoctor's {COMPUTED_FLAGS[flag]}"
                )
        if len(meanings) > 1:
            notes.append(
                f"{shown} is ambiguous for vLLM ({', '.join(sorted(meanings))}); vLLM will refuse it"
            )
            takes = -1
            continue
        flag = next(iter(meanings))
        flags.append(flag)
        if vllm is not None:
            note = judge_flag(vllm, flag).note
            if note and note not in notes:
                notes.append(note)
        name = words[-1].split("=", 1)[0]
        attached = "=" in token or (
            not token.startswith("--")
            and len(name) > 2
            and name not in table
            and not any(option.startswith(name) for option in table)
        )
        takes = 0 if attached else table[flag][1]  # -qfp8, -O3, --dtype=half carry their value
    if problems:
        raise ArgumentError("; ".join(problems))
    return ExtraCheck(flags, notes, words)


def check_environment(
    environment: Mapping[str, str], vllm: Surface | None
) -> tuple[dict[str, str], list[str]]:
    """The server's `VLLM_*` variables for this vLLM: renamed ones translated (with a note), unknown ones
    refused naming the version (ArgumentError). Without `vllm` they pass as they are."""
    if vllm is None:
        return dict(environment), []
    judged = judge_all(vllm, environment, judge_variable)
    if judged.refusals:
        raise ArgumentError("; ".join(judged.refusals))
    return judged.kept, judged.notes


def check_extra(extra: Sequence[str]) -> list[str]:
    """The long names of the vLLM flags among `extra`; ArgumentError for what must not be passed."""
    return inspect_extra(extra).flags


def default_served_name(model: str) -> str:
    """A local directory is served under its name (not its whole path); a Hugging Face id as itself,
    as vLLM would."""
    if model.startswith(("/", "./", "../", "~")):
        return model.rstrip("/").rsplit("/", 1)[-1]
    return model


def memory_class(pool: GpuPool) -> str:
    if pool.unified:
        return "unified"
    return "discrete-large" if (pool.total or 0) >= LARGE_DEVICE_BYTES else "discrete"


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def tensor_parallel_group(pools: Sequence[GpuPool], size: int | None) -> list[GpuPool]:
    """The GPUs vLLM will use: the first one, or `size` GPUs of one family."""
    if not pools:
        return []
    if size is None or size == 1:
        return [pools[0]]
    if size < 1:
        raise ArgumentError(f"--tensor-parallel-size must be 1 or more, not {size}")
    family = pools[0].family
    same = [p for p in pools if p.family == family]
    if len(same) < size:
        others = sorted({p.family for p in pools} - {family})
        found = f"{len(same)} {family} GPU(s)" + (
            f" (and {', '.join(others)}, which cannot share the group)" if others else ""
        )
        raise ArgumentError(
            f"--tensor-parallel-size {size} needs {size} GPUs of one family; this host has {found}"
        )
    return same[:size]


def utilization_for(group: Sequence[GpuPool]) -> tuple[float, str]:
    """The largest value every GPU in the group passes vLLM's startup rule with, and why."""
    unknown = [p.name for p in group if not p.total or p.free is None]
    if unknown:
        raise ArgumentError(
            f"the memory of {', '.join(unknown)} cannot be read (rocmdoctor check says why); "
            "pass --gpu-memory-utilization to choose it yourself"
        )
    sized = [(p, int(p.total or 0), int(p.free or 0)) for p in group]  # both known: checked above
    worst, total, free = min(sized, key=lambda row: recommended(row[1], row[2]))
    util = recommended(total, free)
    pool_word = "unified pool" if worst.unified else "VRAM"
    if util < MIN_USEFUL_UTILIZATION:
        raise ArgumentError(
            f"{worst.name}: only {_gib(free)} of {_gib(total)} {pool_word} is free; "
            "vLLM cannot start with so little. Stop the processes holding GPU memory (rocmdoctor check lists them)"
            + (" or give the GPU a larger GTT pool (rocmdoctor fix-kernel)" if worst.unified else "")
        )
    reason = (
        f"vLLM needs ceil(total x util) <= free at startup: {worst.name} {pool_word} "
        f"{_gib(free)} free of {_gib(total)}, 1 GiB kept as margin "
        f"-> {util:.2f} asks {_gib(requested_bytes(total, util))}"
    )
    return util, reason


def resolve(choices: Choices, pools: Sequence[GpuPool]) -> ServerArgs:
    """The full command line for `<prefix>/current/bin/vllm-server`."""
    if not choices.model:
        raise ArgumentError("no model given: pass --model (a Hugging Face id or a local directory)")
    for option, value in (("--model", choices.model), ("--served-model-name", choices.served_model_name)):
        problem = None if value is None else name_problem(value)
        if problem:
            raise ArgumentError(f"{option} {value!r}: {problem}")
    host_error = host_problem(choices.host)
    if host_error:
        raise ArgumentError(f"--host {choices.host!r}: {host_error}")
    if not 0 < choices.port < 65536:
        raise ArgumentError(f"--port must be between 1 and 65535, not {choices.port}")
    inspected = inspect_extra(parse_extra(choices.extra), choices.vllm)
    extra = inspected.words
    extra_flags = inspected.flags
    notes: list[str] = list(inspected.notes)
    served = choices.served_model_name or default_served_name(choices.model)
    settings = [
        Setting("--model", choices.model, "your choice"),
        Setting(
            "--served-model-name",
            served,
            "your choice" if choices.served_model_name else "default: the directory name or the HF id",
        ),
        Setting(
            "--host",
            choices.host,
            "loopback only: put a TLS proxy in front to expose it"
            if choices.host == DEFAULT_HOST
            else "your choice",
        ),
        Setting("--port", str(choices.port), "your choice" if choices.port != DEFAULT_PORT else "default"),
    ]
    group = tensor_parallel_group(pools, choices.tensor_parallel_size)
    if choices.gpu_memory_utilization is not None:
        util = choices.gpu_memory_utilization
        if not MIN_SETTABLE_UTILIZATION <= util <= 1:  # also false for NaN
            raise ArgumentError(
                f"--gpu-memory-utilization must be from {MIN_SETTABLE_UTILIZATION} to 1, not {util}"
            )
        settings.append(Setting("--gpu-memory-utilization", f"{util:.2f}", "your choice"))
        for pool in group:
            if pool.total and pool.free is not None and pool.free < requested_bytes(pool.total, util):
                notes.append(
                    f"{pool.name}: {util:.2f} asks {_gib(requested_bytes(pool.total, util))} but only "
                    f"{_gib(pool.free)} is free; vLLM will refuse to start"
                )
    elif any(flag in UTILIZATION_REPLACED_BY for flag in extra_flags):
        notes.append(
            "--kv-cache-memory-bytes given: vLLM sizes the KV cache from it and ignores "
            "--gpu-memory-utilization"
        )
    elif group:
        util, reason = utilization_for(group)
        settings.append(Setting("--gpu-memory-utilization", f"{util:.2f}", reason))
    else:
        raise ArgumentError(
            "no AMD GPU found, so the memory vLLM may use cannot be computed; run "
            "`rocmdoctor check`, or pass --gpu-memory-utilization to choose it yourself"
        )
    planned = model_plan_settings(choices, group, settings, extra, notes)
    if planned is not None:
        settings.extend(Setting(flag, value, why) for flag, value, why in planned.settings)
        notes.extend(planned.notes)
    if choices.max_model_len is not None:
        if choices.max_model_len < 1:
            raise ArgumentError(f"--max-model-len must be positive, not {choices.max_model_len}")
        settings.append(Setting("--max-model-len", str(choices.max_model_len), "your choice"))
    if choices.max_num_seqs is not None:
        if choices.max_num_seqs < 1:
            raise ArgumentError(f"--max-num-seqs must be positive, not {choices.max_num_seqs}")
        settings.append(Setting("--max-num-seqs", str(choices.max_num_seqs), "your choice"))
    elif group and not any(s.flag == "--max-num-seqs" for s in settings):
        cls = memory_class(group[0])
        settings.append(
            Setting("--max-num-seqs", str(MAX_NUM_SEQS_BY_CLASS[cls]), f"default for {cls} memory")
        )
    if len(group) > 1:
        settings.append(
            Setting(
                "--tensor-parallel-size", str(len(group)), f"your choice: {len(group)} {group[0].family} GPUs"
            )
        )
    environment: dict[str, str] = {}
    advised = server_environment(group[0].gfx or group[0].family) if group else None
    if advised is not None:
        environment.update(advised.environment)
        notes.append(f"set {', '.join(sorted(advised.environment))} for {group[0].family}: {advised.reason}")
    if choices.vllm is not None:
        for setting in settings:  # what rocmdoctor computes must be a flag of this vLLM too
            verdict = judge_flag(choices.vllm, setting.flag)
            if verdict.refusal:
                raise ArgumentError(f"rocmdoctor's {setting.flag}: {verdict.refusal}")
        environment, env_notes = check_environment(environment, choices.vllm)
        notes.extend(env_notes)
        if not choices.vllm.asked:
            notes.append(f"vLLM arguments checked against {choices.vllm.described()}")
    return ServerArgs(
        settings, extra, notes, environment=environment, plan=planned.plan if planned is not None else None
    )


def model_plan_settings(
    choices: Choices,
    group: Sequence[GpuPool],
    settings: list[Setting],
    extra: Sequence[str],
    notes: list[str],
) -> PlannedSettings | None:
    """--max-model-len and --max-num-seqs from the model's memory plan (rocmdoctor plan), or a refusal
    with the plan when the model cannot start. Offline only: the files must be on this host (a local
    directory or the Hugging Face cache); otherwise a note says why there is no plan."""
    from rocmdoctor.provision.server.plan_settings import plan_for_server, settings_from_plan
    from rocmdoctor.vllm.memory_plan import ConfigError
    from rocmdoctor.vllm.model_files import ModelFilesError

    util = next((float(s.value) for s in settings if s.flag == "--gpu-memory-utilization"), None)
    sized = [p for p in group if p.total]
    if util is None or not sized:
        return None
    tightest = min(sized, key=lambda p: p.total or 0)
    kv_dtype = next((w.split("=", 1)[1] for w in extra if w.startswith("--kv-cache-dtype=")), None)
    if kv_dtype is None and "--kv-cache-dtype" in extra:
        at = list(extra).index("--kv-cache-dtype")
        kv_dtype = extra[at + 1] if at + 1 < len(extra) else None
    try:
        plan = plan_for_server(
            choices.model,
            total_bytes=int(tightest.total or 0),
            utilization=util,
            pool_name=tightest.name,
            tensor_parallel_size=max(1, len(group)),
            kv_cache_dtype="fp8" if kv_dtype and kv_dtype.startswith("fp8") else "auto",
            max_model_len=choices.max_model_len,
            offline=True,
            extra=extra,
            version=choices.serving,
        )
    except (ModelFilesError, ConfigError, OSError) as exc:
        notes.append(f"no memory plan for the model ({exc}); --max-model-len is vLLM's own")
        return None
    cls = memory_class(group[0])
    planned = settings_from_plan(
        plan,
        user_max_model_len=choices.max_model_len,
        user_max_num_seqs=choices.max_num_seqs,
        max_num_seqs_cap=MAX_NUM_SEQS_BY_CLASS[cls],
    )
    if planned.refusal:
        raise ArgumentError(planned.refusal + " (rocmdoctor plan --model ... shows the whole plan)")
    return planned
