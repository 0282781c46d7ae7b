"""Host diagnosis: one module per subsystem, each registering its checks on REGISTRY.

Check modules never touch the system themselves: they read through `ctx.host` only
(tests/unit/test_conformance.py enforces it), return a Result, and never print.
"""

from __future__ import annotations

from typing import Any

from rocmdoctor.registry import Context, Registry

REGISTRY = Registry()
check = REGISTRY.check

# Registration happens on import; the list is explicit so a new module that is not named here
# fails the conformance test instead of silently not running.
# Import order is report order (prerequisites still run first).
from rocmdoctor.checks import system  # noqa: E402,I001
from rocmdoctor.checks import gpu  # noqa: E402
from rocmdoctor.checks import vendor  # noqa: E402
from rocmdoctor.checks import pci_bind  # noqa: E402
from rocmdoctor.checks import driver  # noqa: E402
from rocmdoctor.checks import kernel  # noqa: E402
from rocmdoctor.checks import multi_gpu  # noqa: E402
from rocmdoctor.checks import firmware  # noqa: E402
from rocmdoctor.checks import access  # noqa: E402
from rocmdoctor.checks import memory  # noqa: E402
from rocmdoctor.checks import processes  # noqa: E402
from rocmdoctor.checks import python_env  # noqa: E402
from rocmdoctor.checks import toolchain  # noqa: E402
from rocmdoctor.checks import jit_cache  # noqa: E402
from rocmdoctor.checks import disk  # noqa: E402
from rocmdoctor.checks import deep  # noqa: E402  (the GPU probe, --deep only, runs last: it is the slow one)

MODULES = (
    system,
    gpu,
    vendor,
    pci_bind,
    driver,
    kernel,
    multi_gpu,
    firmware,
    access,
    memory,
    processes,
    python_env,
    toolchain,
    jit_cache,
    disk,
    deep,
)
# Modules in checks/ that register no checks: shared facts and pure rules.
HELPER_MODULES = (
    "facts",
    "container",
    "host_rules",
    "kernel_rules",
    "kernel_guidance",
    "memory_guidance",
    "capture",
)


def load_registry() -> Registry:
    REGISTRY.validate()
    return REGISTRY


def host_facts(ctx: Context) -> dict[str, Any]:
    """The report's `host` section: what the checks found, independent of any verdict."""
    from rocmdoctor.checks.facts import host_facts as facts_host_facts

    return facts_host_facts(ctx)
