"""Fixtures shared by the engine and end-to-end tests."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def mlx_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled SmolLM2 GGUF converted to an MLX model folder, once per session: the
    conversion is part of what the MLX tests test, never a checked-in artefact. mlx, mlx-lm and
    tokenizers are in requirements.txt: a missing one fails these tests, it does not skip them."""
    from scheduler.engines.mlx_convert import convert_gguf
    from scheduler.engines.models import default_model_path

    return convert_gguf(default_model_path(), tmp_path_factory.mktemp("mlx") / "SmolLM2-135M-Instruct-mlx")


@pytest.fixture(autouse=True)
def _no_leaked_resources(request: pytest.FixtureRequest) -> Iterator[None]:
    """Collect each test's garbage when it ends: a socket, connection or file it left open is
    reported against the test that leaked it, instead of failing whichever later test the
    garbage collector happens to run in (warnings are errors here)."""
    yield
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    leaks = sorted({str(w.message) for w in caught if issubclass(w.category, ResourceWarning)})
    if leaks:
        pytest.fail(f"{request.node.nodeid} left resources open: " + "; ".join(leaks[:5]), pytrace=False)
