"""The engine protocol: what the worker needs from llama.cpp, MLX or a simulator.

Adapters import their heavy library inside their own module, so this package imports anywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from scheduler.core.types import TickPlan, TickResult


# The scheduling seed's tick-duration targets in ms, per engine: (a lane is free or one is
# finishing, every lane busy). llama.cpp and MLX declare that a decode round costs the same
# however rounds are cut into ticks, so their ticks are short.
TICK_TARGETS_MS: dict[str, tuple[int, int]] = {"llamacpp": (50, 250), "mlx": (50, 250)}


def busy_tick_target_s(engine_name: str) -> float | None:
    """The engine's tick target while every lane is busy, in seconds; None if the seed gives it
    none (the core's own default then holds)."""
    targets = TICK_TARGETS_MS.get(engine_name)
    return None if targets is None else targets[1] / 1000.0


class EngineError(Exception):
    """An engine failure. ``permanent`` says whether retrying the same request can help."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class Engine(Protocol):
    name: str  # "llamacpp", "mlx", "sim"
    n_lanes: int  # lanes (sequence ids) the engine was built with
    lane_ctx: int  # context tokens per lane

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        """The model's chat template applied to OpenAI-style messages, generation prompt added."""
        ...

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        """Token ids for ``text``; special tokens written in the text are parsed as such."""
        ...

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes a token stands for (may be part of a UTF-8 character)."""
        ...

    def execute(self, plan: TickPlan, should_stop: Callable[[], bool]) -> TickResult:
        """Run one tick: release, park, restore, bind, then feed in calls of at most
        ``plan.step_tokens`` tokens, decode tokens in the first call. Between calls, if
        ``should_stop()`` is true, return what was done (``stopped_early``)."""
        ...

    def close(self) -> None: ...
