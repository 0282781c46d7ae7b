"""Check declarations, selection and the run loop.

A check is a function of a `Context` that returns a `Result`. It declares its id, what it reads
(host path patterns: `snapshot` captures exactly these) and which checks must pass first; the
registry orders them, skips dependents of a failed prerequisite (one root cause, one failure) and
turns any exception into an `error` result, never a traceback.
"""

from __future__ import annotations

import fnmatch
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from rocmdoctor.facts.manifest import Manifest, shipped_manifest
from rocmdoctor.host import Host
from rocmdoctor.model import Action, Probe, Result, Severity, Status

CheckFn = Callable[["Context"], Result]

# Where `install` puts bundles and everything else looks for them (env ROCMDOCTOR_PREFIX on every command).
DEFAULT_PREFIX = "/opt/rocmdoctor"


@dataclass(frozen=True, slots=True)
class CheckSpec:
    id: str
    title: str
    fn: CheckFn
    severity: Severity = Severity.BLOCKING
    depends: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    env: tuple[str, ...] = ()  # environment variable names read (snapshot keeps only these)
    probe: Probe = Probe.PASSIVE
    default_enabled: bool = True
    # What a failure stands in the way of; None: every action a BLOCKING check guards by default (serve).
    blocks: tuple[Action, ...] | None = None

    @property
    def group(self) -> str:
        return self.id.split(".", 1)[0]


@dataclass
class Options:
    """What the user chose that checks take into account."""

    user: str | None = None  # whose device access is checked; None: the invoking user
    port: int = 8000
    prefix: str = DEFAULT_PREFIX
    model_cache: str | None = None  # None: the user's Hugging Face cache
    model_bytes: int = 0  # expected weights size, for disk.space
    python: str | None = None  # interpreter for --deep probes
    deep_timeout_s: float = 180.0
    gpus: tuple[str, ...] = ()  # `--gpu`: the GPUs vLLM will serve (gpu_choice's rule when empty)


@dataclass
class Context:
    host: Host
    options: Options = field(default_factory=Options)
    # The bundles' manifest the user chose (--bundles-dir/--manifest), else the shipped one: which family
    # each gfx belongs to comes from here, for the diagnosis and `install --family auto` alike.
    manifest: Manifest = field(default_factory=shipped_manifest)
    _memo: dict[str, Any] = field(default_factory=dict, repr=False)

    def memo(self, key: str, compute: Callable[[], Any]) -> Any:
        """Facts several checks share (the GPU list, meminfo) are read once per run."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]


@dataclass(frozen=True, slots=True)
class Outcome:
    spec: CheckSpec
    result: Result
    duration_s: float


class RegistryError(ValueError):
    pass


class SelectionError(ValueError):
    """An --only/--skip pattern matched nothing: almost always a typo."""


class Registry:
    def __init__(self) -> None:
        self._specs: dict[str, CheckSpec] = {}

    def add(self, spec: CheckSpec) -> None:
        if spec.id in self._specs:
            raise RegistryError(f"duplicate check id {spec.id!r}")
        self._specs[spec.id] = spec

    def check(
        self,
        id: str,
        title: str,
        *,
        severity: Severity = Severity.BLOCKING,
        depends: Iterable[str] = (),
        reads: Iterable[str] = (),
        env: Iterable[str] = (),
        probe: Probe = Probe.PASSIVE,
        default_enabled: bool = True,
        blocks: Iterable[Action] | None = None,
    ) -> Callable[[CheckFn], CheckFn]:
        def register(fn: CheckFn) -> CheckFn:
            self.add(
                CheckSpec(
                    id,
                    title,
                    fn,
                    severity,
                    tuple(depends),
                    tuple(reads),
                    tuple(env),
                    probe,
                    default_enabled,
                    None if blocks is None else tuple(blocks),
                )
            )
            return fn

        return register

    @property
    def specs(self) -> list[CheckSpec]:
        return list(self._specs.values())

    def get(self, check_id: str) -> CheckSpec:
        return self._specs[check_id]

    def validate(self) -> None:
        """Unknown prerequisites and cycles are bugs of the registry, caught at startup and in CI."""
        for spec in self._specs.values():
            for dep in spec.depends:
                if dep not in self._specs:
                    raise RegistryError(f"{spec.id} depends on unknown check {dep!r}")
        self.ordered(self._specs)

    def ordered(self, ids: Iterable[str]) -> list[CheckSpec]:
        """Prerequisites first, otherwise in declaration order (Kahn's algorithm)."""
        wanted = [i for i in self._specs if i in set(ids)]
        done: list[str] = []
        pending = list(wanted)
        while pending:
            progressed = False
            for cid in list(pending):
                deps = [d for d in self._specs[cid].depends if d in wanted]
                if all(d in done for d in deps):
                    done.append(cid)
                    pending.remove(cid)
                    progressed = True
            if not progressed:
                raise RegistryError(f"dependency cycle among {', '.join(sorted(pending))}")
        return [self._specs[i] for i in done]

    def select(
        self, only: Iterable[str] = (), skip: Iterable[str] = (), include_optional: bool = False
    ) -> list[CheckSpec]:
        """--only/--skip take globs over ids or groups; prerequisites of what is asked come along."""
        only, skip = list(only), list(skip)

        def matches(spec: CheckSpec, pattern: str) -> bool:
            return fnmatch.fnmatchcase(spec.id, pattern) or fnmatch.fnmatchcase(spec.group, pattern)

        for pattern in only + skip:
            if not any(matches(s, pattern) for s in self._specs.values()):
                raise SelectionError(f"no check matches {pattern!r} (see --list-checks)")
        if only:
            chosen = {s.id for s in self._specs.values() if any(matches(s, p) for p in only)}
        else:
            chosen = {s.id for s in self._specs.values() if s.default_enabled or include_optional}
        chosen -= {s.id for s in self._specs.values() if any(matches(s, p) for p in skip)}
        closure = set(chosen)
        stack = list(chosen)
        while stack:
            for dep in self._specs[stack.pop()].depends:
                if dep not in closure:
                    closure.add(dep)
                    stack.append(dep)
        return self.ordered(closure)

    def run(self, ctx: Context, specs: list[CheckSpec]) -> list[Outcome]:
        results: dict[str, Result] = {}
        outcomes: list[Outcome] = []
        for spec in specs:
            started = time.perf_counter()
            blocker = first_blocker(spec.depends, results)
            result = blocked_result(blocker) if blocker is not None else run_isolated(spec, ctx)
            results[spec.id] = result
            outcomes.append(Outcome(spec, result, time.perf_counter() - started))
        return outcomes


def first_blocker(depends: Iterable[str], results: Mapping[str, Result]) -> str | None:
    """The skip rule of checks and steps alike: the first prerequisite that ran and neither passed
    nor warned (one root cause, one failure; its dependents are skipped)."""
    return next(
        (d for d in depends if d in results and results[d].status not in (Status.PASS, Status.WARN)),
        None,
    )


def blocked_result(blocker: str) -> Result:
    return Result(Status.SKIP, f"skipped: {blocker} did not pass", details={"skipped_because_of": blocker})


def _checked(spec_id: str, result: Any) -> Result:
    if not isinstance(result, Result):
        raise TypeError(f"{spec_id} returned {type(result).__name__}, not Result")
    return result


def _crashed(exc: Exception, what: str) -> Result:
    return Result(
        Status.ERROR,
        f"rocmdoctor could not evaluate this {what}: {type(exc).__name__}: {exc}",
        details={"traceback": traceback.format_exc(limit=8)},
    )


def run_isolated(spec: CheckSpec, ctx: Context) -> Result:
    try:
        return _checked(spec.id, spec.fn(ctx))
    except Exception as exc:
        return _crashed(exc, "check")


# -- steps: async functions over any context, run with the checks' skip rule ----------------------

C = TypeVar("C")
StepFn = Callable[[C], Awaitable[Result]]


@dataclass(frozen=True, slots=True)
class StepSpec(Generic[C]):
    id: str
    title: str
    fn: StepFn[C]
    depends: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StepOutcome(Generic[C]):
    spec: StepSpec[C]
    result: Result
    duration_s: float


class Steps(Generic[C]):
    """A declared sequence of async steps over one context of the caller's (smoke's: a client of
    one server). Steps run in declaration order, a prerequisite must be declared before its
    dependents (so there is no cycle), and `run` applies the checks' rule: dependents of a step
    that did not pass are skipped, an exception becomes an error result."""

    def __init__(self) -> None:
        self._specs: dict[str, StepSpec[C]] = {}

    def step(self, id: str, title: str, *, depends: Iterable[str] = ()) -> Callable[[StepFn[C]], StepFn[C]]:
        def register(fn: StepFn[C]) -> StepFn[C]:
            if id in self._specs:
                raise RegistryError(f"duplicate step id {id!r}")
            unknown = [d for d in depends if d not in self._specs]
            if unknown:
                raise RegistryError(f"step {id} depends on {unknown}, not declared before it")
            self._specs[id] = StepSpec(id, title, fn, tuple(depends))
            return fn

        return register

    @property
    def specs(self) -> list[StepSpec[C]]:
        return list(self._specs.values())

    async def run(
        self,
        ctx: C,
        precondition: Callable[[StepSpec[C]], Result | None] = lambda _spec: None,
        blocked: Callable[[str], Result] = blocked_result,
    ) -> list[StepOutcome[C]]:
        """`precondition` may skip a step before the dependency rule is asked (a deadline spent, a
        server gone): it returns that skip's result, or None to go on."""
        results: dict[str, Result] = {}
        outcomes: list[StepOutcome[C]] = []
        for spec in self._specs.values():
            started = time.perf_counter()
            result = precondition(spec)
            if result is None:
                blocker = first_blocker(spec.depends, results)
                result = blocked(blocker) if blocker is not None else await _run_step(spec, ctx)
            results[spec.id] = result
            outcomes.append(StepOutcome(spec, result, time.perf_counter() - started))
        return outcomes


async def _run_step(spec: StepSpec[C], ctx: C) -> Result:
    try:
        return _checked(spec.id, await spec.fn(ctx))
    except Exception as exc:
        return _crashed(exc, "step")
