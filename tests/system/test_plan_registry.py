"""The registry walk (issue 37): every text-generation architecture of the installed vLLM's model
registry (vllm/model_executor/models/registry.py, read from the engine venv, not imported: no torch),
classified for the plan:

- exact: a CPU-engine case of tests/system/test_plan_engine.py serves that architecture and the plan's
  tokens and concurrency equal vLLM's log line;
- refused: its model file reads a config key the plan refuses for its family (kv_keys.KV_LAYOUT_KEYS:
  the key is named), or its model class keeps a recurrent state (IsHybrid, HasInnerState,
  IsAttentionFree) of a family whose state the plan does not size;
- untested: ordinary attention layers, read by the generic rules, with no engine case.

The table in docs/plan.md must be the walk's output: a vLLM upgrade or a new rule that changes a row
fails here until the doc says so (the expected table is written next to the run's log).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from harness.engine import require_vllm_python
from harness.plan_arch_configs import ARCHS
from harness.tiny_model_builder import arch_config
from rocmdoctor.vllm.kv_keys import KV_LAYOUT_KEYS, STATE_KEYS

pytestmark = pytest.mark.engine

DOC = Path(__file__).resolve().parents[2] / "docs" / "plan.md"
START, END = "<!-- registry-walk:start -->", "<!-- registry-walk:end -->"
# the engine test's builder architectures (test_plan_engine.CASES) and issue 37's configs
BUILDER_ARCHS = (
    "granitehybrid",
    "qwen3next",
    "lfm2",
    "jamba",
    "cohere2",
    "llama",
    "qwen3",
    "gemma3",
    "deepseek",
    "oddgqa",
)
STATE_MODULES = {
    "granitemoehybrid",
    "falcon_h1",
    "nemotron_h",
    "qwen3_next",
    "qwen3_5",
    "jamba",
    "lfm2",
    "lfm2_moe",
}
STATE_BASES = ("IsHybrid", "HasInnerState", "IsAttentionFree")


def engine_cases() -> dict[str, list[str]]:
    cases: dict[str, list[str]] = {}
    for name in BUILDER_ARCHS:
        cases.setdefault(arch_config(name, 64)["architectures"][0], []).append(name)
    for name, config in ARCHS.items():
        cases.setdefault(config["architectures"][0], []).append(name)
    return cases


def registry(models_dir: Path) -> dict[str, tuple[str, str]]:
    tree = ast.parse((models_dir / "registry.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_TEXT_GENERATION_MODELS":
            return ast.literal_eval(node.value)
    raise AssertionError("no _TEXT_GENERATION_MODELS in the installed vLLM's registry.py")


def module_source(models_dir: Path, module: str) -> str:
    """The model file's text; a package (vllm.models.kimi_k3) is every Python file in it."""
    if "." not in module:
        path = models_dir / f"{module}.py"
        return path.read_text() if path.is_file() else ""
    path = models_dir.parents[2] / Path(*module.split("."))
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py").read_text()
    return "\n".join(p.read_text() for p in sorted(path.rglob("*.py")))


def unmodelled_keys(module: str, source: str) -> list[str]:
    """The KV-layout keys this model file reads that the plan refuses for its family."""
    short = module.rsplit(".", 1)[-1]
    keys = []
    for key, (modelled, _) in KV_LAYOUT_KEYS.items():
        if key == "kv_lora_rank" or short in modelled or f"{short}_text" in modelled:
            continue
        if key in STATE_KEYS and short in STATE_MODULES:
            continue
        if re.search(rf"[\"']{key}[\"']|\.{key}\b", source):
            keys.append(key)
    return keys


def classify(arch: str, module: str, cls: str, source: str, cases: dict[str, list[str]]) -> tuple[str, str]:
    short = module.rsplit(".", 1)[-1]
    keys = unmodelled_keys(module, source)
    state_keys = [key for key in keys if key in STATE_KEYS]
    when = "; refused when config.json sets " + ", ".join(f"`{k}`" for k in keys if k not in STATE_KEYS)
    when = when if any(k not in STATE_KEYS for k in keys) else ""
    if arch in cases:
        return "exact", "CPU engine case " + ", ".join(cases[arch]) + when
    found = next(
        (node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef) and node.name == cls),
        None,
    )
    bases = {getattr(b, "id", getattr(b, "attr", "")) for b in (found.bases if found else [])}
    state = sorted(bases & set(STATE_BASES))
    if (state or state_keys) and short not in STATE_MODULES:
        sized_by = f" (`{state_keys[0]}`)" if state_keys else ""
        return "refused", f"recurrent state{sized_by} of a family whose state is not sized" + when
    mla = (
        "; `kv_lora_rank`: MLA on is_deepseek_mla types, refused on others"
        if "kv_lora_rank" in source
        else ""
    )
    return "untested", "ordinary attention by the generic rules; no engine case" + mla + when


def walk_table(models_dir: Path) -> str:
    cases = engine_cases()
    rows = ["| Architecture | vLLM module | Plan | Why |", "|---|---|---|---|"]
    for arch, (module, cls) in sorted(registry(models_dir).items()):
        source = module_source(models_dir, module)
        verdict, why = (
            classify(arch, module, cls, source, cases) if source else ("untested", "model file not found")
        )
        rows.append(f"| `{arch}` | `{module}` | {verdict} | {why} |")
    return "\n".join(rows)


def test_registry_walk_table_is_the_one_in_docs(tmp_path: Path):
    python = require_vllm_python()
    models_dir = next(python.parents[1].glob("lib/python3*/site-packages/vllm/model_executor/models"))
    table = walk_table(models_dir)
    (tmp_path / "registry-walk.md").write_text(table + "\n")
    cases = engine_cases()
    known = registry(models_dir)
    assert set(cases) <= set(known), (
        f"engine cases for architectures vLLM no longer lists: {set(cases) - set(known)}"
    )
    rows = {line.split("|")[1].strip(" `"): line.split("|")[3].strip() for line in table.splitlines()[2:]}
    assert rows["MiniCPM3ForCausalLM"] == "exact" and rows["Gemma4ForCausalLM"] == "exact"
    assert rows["KimiLinearForCausalLM"] == "refused" and rows["Zamba2ForCausalLM"] == "refused"
    doc = DOC.read_text()
    assert START in doc and END in doc, "docs/plan.md has no registry-walk block"
    in_doc = doc.split(START, 1)[1].split(END, 1)[0].strip()
    assert in_doc == table, (
        f"docs/plan.md's registry table differs from the walk; the walk's: {tmp_path / 'registry-walk.md'}"
    )
