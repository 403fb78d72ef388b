"""The engine protocol: what the worker needs from llama.cpp, MLX or a simulator.

Adapters import their heavy library inside their own module, so this package imports anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any, NamedTuple, Protocol

from scheduler.core.types import LaneFeed, TickPlan, TickResult

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


class Piece(NamedTuple):
    """Tokens of one lane's feed placed in one engine step (a ``llama_decode`` call, an MLX
    forward pass)."""

    lane: int
    start: int  # position of the first token in the lane's sequence
    tokens: list[int]
    sample: bool  # the feed ends here and asks for a token after it


class Step(NamedTuple):
    pieces: list[Piece]
    prefill: bool  # carries prompt tokens, not only decode tokens (timed as prefill)
    last: bool  # no feed is left after this step


def pack_steps(plan: TickPlan, cap: int, n_lanes: int, bound: Collection[int]) -> Iterator[Step]:
    """The engine steps of a tick, the same for every engine: decode feeds first, so every
    decoding lane advances in the first step even when the tick stops early; prompt chunks
    fill the rest; at most ``cap`` tokens a step (the plan's ``step_tokens``, within what the
    engine's batch holds; ``should_stop()`` is asked between steps). Feeds are checked before any step: a lane out of range or one that samples
    without a sampler ``bound`` raises EngineError."""
    if cap < 1:
        raise EngineError("step_tokens must be at least 1", permanent=True)
    feeds: list[LaneFeed] = [f for f in plan.feeds if f.sample and len(f.tokens) == 1]
    feeds += [f for f in plan.feeds if f.tokens and not (f.sample and len(f.tokens) == 1)]
    for f in feeds:
        if not 0 <= f.lane < n_lanes:
            raise EngineError(f"lane {f.lane} out of range", permanent=True)
        if f.sample and f.lane not in bound:
            raise EngineError(f"lane {f.lane} has no sampler bound", permanent=True)
    n_feeds = len(feeds)
    i = 0  # next feed
    off = 0  # tokens of feeds[i] already placed in an earlier step
    while i < n_feeds:
        n = 0
        pieces: list[Piece] = []
        prefill = False
        while i < n_feeds and n < cap:
            f = feeds[i]
            k = min(len(f.tokens) - off, cap - n)
            ends = off + k == len(f.tokens)
            pieces.append(Piece(f.lane, f.start_pos + off, f.tokens[off : off + k], f.sample and ends))
            prefill = prefill or not f.is_decode
            n += k
            if ends:
                i, off = i + 1, 0
            else:
                off += k
        yield Step(pieces, prefill, i >= n_feeds)
