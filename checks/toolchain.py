"""The C toolchain Triton needs at the first model load: a compiler, binutils, libc headers and crt
files, and libgcc_s.

Triton compiles its launcher stubs with `$CC` (else gcc, else clang) as
`cc src.c -O3 -shared -fPIC -Wno-psabi -o mod.so ...` (triton/runtime/build.py); the bundle's
launcher sets CC to its own clang (`_rocm_sdk_core/lib/llvm/bin/clang`, provisioning-facts.md §2),
which still links through the system's `ld`, crt files and libgcc_s. Missing pieces surface at model
load as "fatal error: stdlib.h: No such file or directory", "cannot find crti.o" or
"cannot find -lgcc_s" (peers-and-pain-points.md: Docker needs build-essential for Triton JIT).

The check links one empty shared object that includes <stdlib.h>, output to /dev/null, with the
compiler the bundle will use: about 60 ms. It runs only on the live host (a replayed capture carries
no compiler) and compiles only where a bundle is installed; before that it looks for the files.
"""

from __future__ import annotations

from typing import Any

from rocmdoctor.checks import check
from rocmdoctor.checks.facts import DISTRO_READS, distro_info
from rocmdoctor.checks.kernel_guidance import distro_family
from rocmdoctor.model import Result, Severity, failed, passed, skipped, warned
from rocmdoctor.registry import DEFAULT_PREFIX, Context

BUNDLE_CLANG = "lib/python3*/site-packages/_rocm_sdk_core/lib/llvm/bin/clang"
SYSTEM_COMPILERS = ("gcc", "clang", "cc")  # Triton's own order after $CC, then the generic name
COMPILE_TIMEOUT_S = 10.0
STDLIB_H = ("/usr/include/stdlib.h",)
CRTI = ("/usr/lib/*-linux-gnu/crti.o", "/usr/lib64/crti.o", "/usr/lib/crti.o")
LIBGCC_S = ("/usr/lib/gcc/*/*/libgcc_s.so", "/usr/lib64/libgcc_s.so", "/usr/lib/libgcc_s.so")
PATH_DIRS = ("/usr/local/bin", "/usr/bin", "/bin")

PACKAGES = {
    "ubuntu": "sudo apt install build-essential",
    "debian": "sudo apt install build-essential",
    "fedora": "sudo dnf install gcc glibc-devel binutils",
    "arch": "sudo pacman -S --needed base-devel",
    "opensuse": "sudo zypper install gcc glibc-devel binutils",
}
# What a failed link says, and the piece that is missing.
SIGNATURES = (
    ("stdlib.h", "libc headers"),
    ("crti.o", "libc start files (crti.o)"),
    ("crt1.o", "libc start files (crt1.o)"),
    ("-lgcc_s", "libgcc_s (the GCC runtime's link library)"),
    ("-lgcc", "libgcc"),
    ('"ld"', "the linker (binutils)"),
    ("linker command failed", "a working linker (binutils)"),
    ("collect2", "a working linker (binutils)"),
)


def install_command(ctx: Context) -> str:
    info = distro_info(ctx)
    family = distro_family(info.get("id"), info.get("like"))
    return PACKAGES.get(family, "install gcc, binutils and the libc development headers")


def bundle_dir(ctx: Context) -> str:
    return f"{(ctx.options.prefix or DEFAULT_PREFIX).rstrip('/')}/current"


def bundle_compiler(ctx: Context) -> str | None:
    found = ctx.host.glob(f"{bundle_dir(ctx)}/{BUNDLE_CLANG}")
    return found[0] if found else None


def system_compiler(ctx: Context) -> str | None:
    """What Triton falls back to: $CC, else gcc, else clang on PATH."""
    cc = ctx.host.env.get("CC", "").strip()
    if cc:
        return cc
    dirs = [d for d in ctx.host.env.get("PATH", "").split(":") if d.startswith("/")] or list(PATH_DIRS)
    for name in SYSTEM_COMPILERS:
        for directory in dirs:
            if ctx.host.exists(f"{directory.rstrip('/')}/{name}"):
                return f"{directory.rstrip('/')}/{name}"
    return None


def missing_files(ctx: Context) -> list[str]:
    missing = []
    for what, patterns in (("stdlib.h", STDLIB_H), ("crti.o", CRTI), ("libgcc_s.so", LIBGCC_S)):
        if not any(ctx.host.glob(p) for p in patterns):
            missing.append(what)
    return missing


def link_argv(compiler: str) -> list[str]:
    return [
        compiler,
        "-x",
        "c",
        "-include",
        "stdlib.h",
        "-O3",
        "-shared",
        "-fPIC",
        "-Wno-psabi",
        "-o",
        "/dev/null",
        "/dev/null",
    ]


def diagnose(stderr: str) -> str:
    for needle, piece in SIGNATURES:
        if needle in stderr:
            return piece
    return "a piece of the toolchain"


@check(
    "toolchain.jit",
    "Triton can compile at model load (C compiler, binutils, libc headers, libgcc_s)",
    severity=Severity.BLOCKING,
    reads=(
        f"{DEFAULT_PREFIX}/current/{BUNDLE_CLANG}",
        *STDLIB_H,
        *CRTI,
        *LIBGCC_S,
        *(f"{d}/{n}" for d in PATH_DIRS for n in SYSTEM_COMPILERS),
        f"{DEFAULT_PREFIX}/current/bin/python3",
        *DISTRO_READS,
    ),
    env=("CC", "PATH"),
)
def toolchain_jit(ctx: Context) -> Result:
    if not ctx.host.is_live:
        return skipped("replayed root: the compile test runs only on the live host, never on a capture")
    installed = ctx.host.exists(f"{bundle_dir(ctx)}/bin/python3")
    bundled = bundle_compiler(ctx)
    compiler = bundled or system_compiler(ctx)
    missing = missing_files(ctx)
    details: dict[str, Any] = {
        "compiler": compiler,
        "bundle_installed": installed,
        "bundle_compiler": bundled is not None,
        "missing_files": missing,
    }
    if not installed:
        if missing:
            return warned(
                f"no {', '.join(missing)} on this host: Triton's first compile at model load will fail "
                "(the bundle brings clang, not libc headers, crt files or libgcc_s)",
                f"{install_command(ctx)}.",
                **details,
            )
        return passed(
            "libc headers, crt files and libgcc_s are present; the compile test runs once a bundle is installed",
            **details,
        )
    if compiler is None:
        return failed(
            f"the bundle at {bundle_dir(ctx)} has no clang and there is no C compiler ($CC, gcc, clang): "
            "Triton fails at the first model load",
            f"{install_command(ctx)}.",
            **details,
        )
    res = ctx.host.run(link_argv(compiler), timeout=COMPILE_TIMEOUT_S)
    details.update(
        seconds=round(res.duration_s, 3),
        exit_code=res.returncode,
        stderr_tail="\n".join(res.stderr.strip().splitlines()[-4:])[-800:],
    )
    if res.ok:
        return passed(f"{compiler} links a shared object ({res.duration_s:.2f} s): Triton can JIT", **details)
    if res.timed_out:
        return warned(
            f"linking an empty shared object with {compiler} took over {COMPILE_TIMEOUT_S:.0f} s",
            f"Check the host's load and the compiler (run it by hand: `{' '.join(link_argv(compiler))}`).",
            **details,
        )
    if res.spawn_error:
        return failed(
            f"cannot start the compiler {compiler}: {res.spawn_error}",
            f"Reinstall the bundle (`rocmdoctor install --force`) or `chmod +x {compiler}*`."
            if compiler == bundled
            else f"Point CC at a working compiler or {install_command(ctx)}.",
            **details,
        )
    piece = diagnose(res.stderr)
    return failed(
        f"{compiler} cannot link a shared object, so Triton fails at the first model load: {piece} missing "
        f"({details['stderr_tail'].splitlines()[-1] if details['stderr_tail'] else 'no output'})",
        f"{install_command(ctx)}; then `rocmdoctor check --only toolchain.jit`.",
        **details,
    )
