"""Environment that leaks into the bundle's own interpreter: PYTHONPATH, user site-packages, overrides."""

from __future__ import annotations

from rocmdoctor.checks import check
from rocmdoctor.checks.access import PASSWD, find_account, target_user
from rocmdoctor.checks.facts import sentence
from rocmdoctor.model import Result, Severity, passed, warned
from rocmdoctor.registry import Context

# Conventional homes of people and service users; a user site elsewhere is not looked for.
HOME_PATTERNS = ("/root", "/home/*", "/var/lib/*", "/opt/*", "/srv/*")
USER_SITE = ".local/lib/python3*/site-packages/huggingface_hub"
LEAKY_ENV = {
    "PYTHONPATH": "puts other packages ahead of the bundle's own",
    "PYTHONHOME": "points the bundled interpreter at another standard library",
    "PYTHONSTARTUP": "runs code in every interactive interpreter",
    "LD_PRELOAD": "injects libraries into the bundle's processes",
    "HSA_OVERRIDE_GFX_VERSION": "makes HSA init fail on TheRock runtimes (the bundle's ROCm)",
}
ENV_NAMES = (*LEAKY_ENV, "PYTHONNOUSERSITE", "PYTHONUSERBASE", "LD_LIBRARY_PATH", "HOME")


def user_bases(ctx: Context) -> list[str]:
    env = ctx.host.env
    if env.get("PYTHONUSERBASE"):
        return [env["PYTHONUSERBASE"].rstrip("/")]
    name = target_user(ctx)
    account = find_account(ctx, name) if name else None
    homes = [account.home] if account and account.home else []
    if not ctx.options.user and env.get("HOME"):
        homes.append(env["HOME"])
    return [f"{h.rstrip('/')}/.local" for h in dict.fromkeys(homes) if h.startswith("/")]


@check(
    "python.isolation",
    "No environment leaking into the bundled Python",
    severity=Severity.DEGRADING,
    reads=(PASSWD, *(f"{h}/{USER_SITE}" for h in HOME_PATTERNS)),
    env=ENV_NAMES,
)
def python_isolation(ctx: Context) -> Result:
    env = ctx.host.env
    findings = [f"{name} is set ({why})" for name, why in LEAKY_ENV.items() if env.get(name)]
    remedies = (
        [f"unset {', '.join(n for n in LEAKY_ENV if env.get(n))} for the vLLM service"] if findings else []
    )
    if "rocm" in env.get("LD_LIBRARY_PATH", "").lower():
        findings.append("LD_LIBRARY_PATH names a system ROCm, whose libraries shadow the bundle's")
        remedies.append("drop the ROCm entries from LD_LIBRARY_PATH")
    shadowing = []
    if not env.get("PYTHONNOUSERSITE"):
        for base in user_bases(ctx):
            shadowing.extend(ctx.host.glob(f"{base}/lib/python3*/site-packages/huggingface_hub"))
    if shadowing:
        findings.append(f"user site-packages shadow the bundle: {', '.join(shadowing)}")
        remedies.append(
            "set PYTHONNOUSERSITE=1 for vLLM (the rocmdoctor unit does) or "
            "`pip uninstall --user huggingface_hub`"
        )
    details = {
        "set": sorted(n for n in ENV_NAMES if env.get(n) and n != "HOME"),
        "user_site_packages": shadowing,
    }
    if findings:
        return warned("; ".join(findings), sentence(remedies), **details)
    return passed("no PYTHONPATH, user site-packages or runtime overrides leak into the bundle", **details)
