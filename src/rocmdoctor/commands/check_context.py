"""The checks' Context from the command line (`--user`, `--port`, `--prefix`, `--gpu`): what `check`,
`fix`, `fix-kernel` and `snapshot` diagnose with, so none of them imports another command."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rocmdoctor.commands.common import App, UserError

if TYPE_CHECKING:
    from rocmdoctor.registry import Context


def check_context(
    app: App,
    user: str | None,
    port: int,
    prefix: str,
    python: str | None = None,
    deep_timeout: float | None = None,
):
    from rocmdoctor.registry import Context, Options

    options = Options(user=user, port=port, prefix=prefix, python=python)
    if deep_timeout is not None:
        options.deep_timeout_s = deep_timeout
    return Context(app.host(), options)


def choose_gpus(ctx: Context, specs: tuple[str, ...]) -> None:
    """`--gpu` for the checks: each value must name a GPU node here (exit 2 naming the options)."""
    from rocmdoctor.checks.facts import gpu_label, gpus
    from rocmdoctor.facts.gpu_choice import gpu_spec_matches

    found = gpus(ctx)
    for spec in specs:
        if not any(gpu_spec_matches(spec, g.node, g.pci_slot or g.physical_slot) for g in found):
            options = "; ".join(
                f"--gpu {g.pci_slot or f'node:{g.node}'} ({gpu_label(ctx, g)})" for g in found
            )
            raise UserError(
                f"--gpu {spec}: no GPU node here has that PCI slot or KFD node; choose: {options or 'none'}"
            )
    ctx.options.gpus = specs
