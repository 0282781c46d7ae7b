"""What an installed vLLM accepts, asked of itself: run by the bundle's own interpreter (standard library
and vLLM only; it cannot import rocmdoctor). Prints one JSON document on stdout:

    {"vllm_version": "0.20.1",
     "flags": {"--max-num-seqs": ["--max-num-seqs", 1, "int", null, false], ...},
     "environment": ["VLLM_ATTENTION_BACKEND", ...]}

A flag: every option string of the `vllm serve` parser (vLLM's own make_arg_parser, taken from the
module the `serve` subcommand imports it into, which is the same from 0.19 to 0.32) -> [the action's
first long option, how many words it takes (0, 1, N, -1 for any number), its type's name, its choices,
vLLM's deprecation text or null]. The environment: the names vllm.envs knows (environment_variables).
Used for the record beside the qualification record (provision/bundle/qualify.py) and, run on each
bundled version's real wheel, for the tables rocmdoctor ships (src/rocmdoctor/vllm/surfaces/).
"""

from __future__ import annotations

import json
import os
import sys
import warnings


def values(nargs: object) -> int:
    if nargs == 0:
        return 0
    if nargs is None or nargs == "?":
        return 1
    if isinstance(nargs, int):
        return nargs
    return -1


def type_name(kind: object) -> str | None:
    if kind is None:
        return None
    name = getattr(kind, "__name__", None)
    return name if isinstance(name, str) and name.isidentifier() else type(kind).__name__


def deprecation(parser: object, action: object) -> str | None:
    """vLLM's own words when it marks the flag deprecated: Python 3.13's argparse flag, the set
    FlexibleArgumentParser keeps before 3.13, a Deprecated*Action (0.32's --log-config-file) or its help."""
    text = " ".join(str(getattr(action, "help", "") or "").split())
    marked = bool(getattr(action, "deprecated", False)) or action in getattr(parser, "_deprecated", ())
    if marked or type(action).__name__.startswith("Deprecated") or "deprecated" in text.lower():
        return text[:300] or "deprecated"
    return None


def surface() -> dict:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    warnings.simplefilter("ignore")
    # the bundle's vLLM, absent where rocmdoctor itself runs
    import vllm  # type: ignore[import-not-found]
    import vllm.entrypoints.cli.serve as serve  # type: ignore[import-not-found]
    import vllm.envs as envs  # type: ignore[import-not-found]
    from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]

    parser = serve.make_arg_parser(FlexibleArgumentParser())
    flags: dict[str, list] = {}
    for action in parser._actions:
        if not action.option_strings:
            continue  # model_tag
        longs = [option for option in action.option_strings if option.startswith("--")]
        canonical = (longs or action.option_strings)[0]
        choices = sorted(str(c) for c in action.choices) if action.choices else None
        deprecated = deprecation(parser, action)
        for option in action.option_strings:
            flags[option] = [canonical, values(action.nargs), type_name(action.type), choices, deprecated]
    return {
        "vllm_version": vllm.__version__,
        "flags": dict(sorted(flags.items())),
        "environment": sorted(envs.environment_variables),
    }


def main() -> None:
    # vLLM prints to stdout while it imports ("Triton is installed, but ..."): everything but the
    # document goes to stderr, at the descriptor, so C code's prints cannot reach it either.
    document = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    json.dump(surface(), document, indent=1, sort_keys=True)
    document.write("\n")
    document.close()


if __name__ == "__main__":
    main()
