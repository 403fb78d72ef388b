"""The in-process middle layer (tests/edge/inproc.py) around the scripted engine
(test_stream_equivalence.ScriptEngine: it writes what its prompt's script says) given a model's
real chat template (tests/api/templates_s46/, llama.cpp's upstream copies), which the worker
reads the model's tool and reasoning formats from, as from a real model's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .inproc import SimWorker, attached_loop
from .test_stream_equivalence import ScriptEngine

TEMPLATES = Path(__file__).parent.parent / "api" / "templates_s46"


class TemplateEngine(ScriptEngine):
    """The scripted engine with the chat template ``template`` (a subclass's: its source)."""

    template = ""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.features = self.features | {"template_vars"}
        self.chat_template = self.template


def engine_of(template_file: str, base: type[TemplateEngine] = TemplateEngine) -> type[TemplateEngine]:
    """A :class:`TemplateEngine` (of ``base``) with the template of ``template_file`` in TEMPLATES."""
    return type(f"Engine_{template_file}", (base,), {"template": (TEMPLATES / template_file).read_text()})


def edge_loop(engine: type[ScriptEngine], *, lanes: int = 2, lane_ctx: int = 2048) -> Iterator[asyncio.AbstractEventLoop]:
    """A fixture's loop with a worker of ``engine`` attached (no fill-in-the-middle rate)."""

    class Worker(SimWorker):
        engine_class = engine

    with attached_loop(Worker(lanes=lanes, lane_ctx=lane_ctx), SUPERFLUID_COMPLETION_RATE="0") as loop:
        yield loop


def loop_fixture(name: str, engine: type[ScriptEngine]) -> Any:
    """A pytest fixture called ``name``: the loop of :func:`edge_loop` around ``engine``."""
    import pytest

    def loop() -> Iterator[asyncio.AbstractEventLoop]:
        yield from edge_loop(engine)

    return pytest.fixture(loop, name=name)
