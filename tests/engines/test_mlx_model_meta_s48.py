"""/v1/models' ``meta`` on the MLX engine: its worker's hello said no ``n_embd``, ``n_params`` nor
``size`` (the llama.cpp engine's ``model_meta`` gives them), so an MLX model's /v1/models meta had
only ``n_ctx_train`` and ``n_vocab``. The same SmolLM2 as the llama.cpp engine serves, converted
(float32, and the quantised default): the same width and parameter count."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from scheduler.core.scheduler import SchedulerConfig
from scheduler.worker.loop import EngineWorker

pytestmark = pytest.mark.model

N_EMBD, N_PARAMS = 576, 134_515_008  # SmolLM2-135M, as llama.cpp counts it (tests/e2e: n_embd 576)


def hello_meta(engine: Any) -> dict[str, Any]:
    from api.views import model_meta

    worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=256), model_name="m")
    return model_meta(worker.hello())


def test_the_llama_cpp_engines_meta_is_what_the_mlx_one_is_held_to() -> None:
    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.engines.models import default_model_path

    with closing(LlamaCppEngine(str(default_model_path()), n_lanes=1, lane_ctx=256)) as engine:
        meta = hello_meta(engine)
    assert (meta["n_embd"], meta["n_params"]) == (N_EMBD, N_PARAMS)


@pytest.mark.parametrize("folder", ["mlx_float_dir", "mlx_model_dir"])
def test_an_mlx_models_hello_gives_its_width_parameters_and_size(folder: str, request: pytest.FixtureRequest) -> None:
    from scheduler.engines.mlx import MlxEngine

    path: Path = request.getfixturevalue(folder)
    weights = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    with closing(MlxEngine(path, n_lanes=1, lane_ctx=256)) as engine:
        meta = hello_meta(engine)
    assert meta["n_embd"] == N_EMBD
    assert meta["n_params"] == N_PARAMS  # a quantised layer's weights counted unpacked, not as packed words
    assert 0.9 * weights < meta["size"] <= weights  # the weights' bytes as loaded (the files hold a header too)
    assert "ftype" not in meta
