"""The engine the chat-template tests tokenise with: the bundled model in-process, one lane, once
per module. A module that needs another engine (other lanes, MLX, both) defines its own
``engine`` fixture, which takes the place of this one there."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.engines.models import default_model_path

    eng = LlamaCppEngine(default_model_path(), n_lanes=1, lane_ctx=2048)
    with closing(eng):
        yield eng
