"""The shared real vLLM engine: one server per test session (per xdist worker), started on first use.

It requires an API key (the realistic setup): /health, /metrics and /version stay open, the /v1
routes need `Authorization: Bearer <vllm_engine.api_key>`. Tests that use it get the `engine`
marker, so `-m "not engine"` leaves them out.
"""

from __future__ import annotations

import pytest

from harness.engine import make_tiny_model, require_vllm_python, start_engine

ENGINE_API_KEY = "rocmdoctor-test-key"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "vllm_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory):
    require_vllm_python()
    model = make_tiny_model(tmp_path_factory.mktemp("tiny-model"))
    log = tmp_path_factory.mktemp("vllm-engine") / "vllm.log"
    with start_engine(model, api_key=ENGINE_API_KEY, log_path=log) as engine:
        yield engine


@pytest.fixture(scope="session")
def vllm_engine_key_file(vllm_engine, tmp_path_factory: pytest.TempPathFactory):
    """The shared engine's API key in a file, as `--api-key-file` takes it."""
    path = tmp_path_factory.mktemp("vllm-engine-key") / "api-key"
    path.write_text(vllm_engine.api_key + "\n")
    path.chmod(0o600)
    return path
