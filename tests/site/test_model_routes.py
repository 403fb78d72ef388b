"""The several-models admin route takes every id the config accepts."""

from __future__ import annotations

import pytest
from django.urls import resolve

from api import views


@pytest.mark.parametrize("model_id", ["smol", "Qwen/Qwen3-0.6B", "org/family/name:q4"])
@pytest.mark.parametrize("action", ["load", "unload"])
def test_a_model_id_with_slashes_reaches_the_load_and_unload_route(model_id: str, action: str) -> None:
    """A config's key such as ``Qwen/Qwen3-0.6B`` (Hugging Face's naming) is a model id; its
    load/unload route resolved to the unknown-route 404 (the id allowed no slash), though
    ``GET /v1/models/Qwen/Qwen3-0.6B`` answered."""
    match = resolve(f"/v1/internal/models/{model_id}/{action}")
    assert match.func.__wrapped__ is views.admin_models or match.func.__name__ == "admin_models"
    assert match.kwargs == {"model_id": model_id, "action": action}
