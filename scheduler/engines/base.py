"""The engine protocol: what the worker needs from llama.cpp, MLX or a simulator.

Adapters import their heavy library inside their own module, so this package imports anywhere.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, NamedTuple, Protocol, Self

from scheduler.core.types import LaneBind, LaneFeed, TickPlan, TickResult
from scheduler.engines.hf_vocab import bos_once

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
    """An engine failure. ``permanent`` says whether retrying the same request can help;
    ``partial`` is what the tick did before an engine step failed (None when it failed before
    any step: the worker then cannot keep part of it)."""

    def __init__(self, message: str, *, permanent: bool = False, partial: TickResult | None = None) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.partial = partial


class Unsupported(EngineError):
    """What the request asks of the engine its model cannot do (embeddings of a reranker):
    the client's request, not a failure, answered 400 ``unsupported_parameter``."""


class StepAborted(EngineError):
    """An engine step stopped by :meth:`abort_step` before it finished; the engine rolled the
    step back (nothing of it is in the KV cache and nothing was sampled)."""


class Engine(Protocol):
    name: str  # "llamacpp", "mlx", "sim"
    n_lanes: int  # lanes (sequence ids) the engine was built with
    lane_ctx: int  # context tokens per lane

    def render_chat(self, messages: list[dict[str, Any]], **extra: Any) -> str:
        """The model's chat template applied to OpenAI-style messages, generation prompt added;
        ``extra`` are more template variables (``tools``, chat_template_kwargs), passed only
        when the engine has the ``template_vars`` feature."""
        ...

    @property
    def features(self) -> frozenset[str]:
        """Request features beyond the basic sampler chain that the engine honours:
        ``logit_bias``, ``ignore_eos``, ``typical_p``, ``grammar``, ``logprobs``,
        ``template_vars``. A request needing one the engine lacks is refused with a 400."""
        ...

    @property
    def chat_template(self) -> str | None:
        """The model's own chat template source, if it has one."""
        ...

    @property
    def n_ctx_train(self) -> int | None:
        """The context the model was trained with, where the engine knows it (/v1/models' meta)."""
        ...

    def check_grammar(self, grammar: str) -> str | None:
        """Why the GBNF grammar does not compile for this engine; None if it does."""
        ...

    def tokenize(self, text: str, *, add_special: bool = True, special: bool = True, after: int | None = None) -> list[int]:
        """Token ids for ``text``; special tokens written in the text are parsed as such, unless
        ``special`` is False (what a client wrote: ``<|im_end|>`` there is plain text).

        ``after``: the last token of the text ``text`` continues (None: the text starts here),
        when a text is tokenised piece by piece (``chat.chat_prompt_tokens``). A vocabulary that
        prefixes a space to a text's start (SentencePiece's add_space_prefix: Llama 2's,
        Mistral's) then gives ``text`` one only where the whole text has one: right after a
        special token, as the tokenizer does there. An engine whose vocabulary prefixes nothing
        ignores it."""
        ...

    vocab_size: int  # token ids are 0..vocab_size-1

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes a token stands for (may be part of a UTF-8 character)."""
        ...

    def fim_tokens(self) -> tuple[int, int, int] | None:
        """(prefix, suffix, middle) token ids for fill-in-the-middle; None if the model has none."""
        ...

    def fim_repo_tokens(self) -> tuple[int | None, int | None]:
        """(file separator, repository name) token ids of repo-level fill-in-the-middle
        (``<|file_sep|>``, ``<|repo_name|>``: llama.cpp's FIM_SEP and FIM_REP), each None where
        the model has none; ``POST /infill`` lays its extra context chunks out with them."""
        ...

    def execute(self, plan: TickPlan, should_stop: Callable[[], bool]) -> TickResult:
        """Run one tick (:func:`run_tick` over the engine's primitives): the pool and lane
        operations, then the feeds in calls of at most ``plan.step_tokens`` tokens, decode
        tokens in the first call. Between calls, if ``should_stop()`` is true, return what was
        done (``stopped_early``)."""
        ...

    def close(self) -> None: ...


class TickPrimitives(Protocol):
    """What :func:`run_tick` asks of an engine: small operations on sequences (lanes
    ``0..n_lanes-1``, then the prefix-cache slots up to ``n_seqs``), each already range-checked
    by run_tick."""

    n_lanes: int
    max_step_tokens: int  # most tokens one forward call holds

    @property
    def n_seqs(self) -> int:
        """Lanes plus prefix-cache slots."""
        ...

    def save(self, seq: int) -> Any:
        """A copy of the sequence's KV (an artifact with ``nbytes``), for parking or eviction."""
        ...

    def load(self, seq: int, artifact: Any) -> None:
        """Replace the sequence's KV with a saved one (restore a parked lane, import a prefix)."""
        ...

    def clear(self, seq: int) -> None:
        """Empty the sequence's KV."""
        ...

    def trim(self, seq: int, n_tokens: int) -> None:
        """Keep only the first ``n_tokens`` (at least 1) of the sequence's KV."""
        ...

    def copy_prefix(self, src: int, dst: int, n_tokens: int) -> None:
        """Make ``dst`` hold the first ``n_tokens`` of ``src``'s KV."""
        ...

    def bind_sampler(self, bind: LaneBind) -> None:
        """Give the lane a new sampler for its job, having seen ``bind.history``."""
        ...

    def drop_sampler(self, lane: int) -> None: ...

    def swap_samplers(self, a: int, b: int) -> None:
        """Lanes ``a`` and ``b`` trade samplers as they are (random state, grammar, penalties),
        either of them possibly without one."""
        ...

    def bound_lanes(self) -> Collection[int]:
        """Lanes holding a sampler."""
        ...

    def forward(self, step: Step) -> Mapping[int, int]:
        """Run one step's pieces through the model; the token sampled for each lane whose
        piece samples. Raises EngineError if the step could not run."""
        ...

    def is_eog(self, token: int) -> bool: ...

    def take_logprobs(self) -> Mapping[int, tuple[float, list[tuple[int, float]]]]:
        """For the lanes of the last ``forward`` whose sampler asks for logprobs: (logprob of the
        sampled token, [(token, logprob), ...] top alternatives); the engine computes them in
        ``forward`` and forgets them here. Empty for an engine without the logprobs feature."""
        ...

    def take_failed(self) -> Mapping[int, str]:
        """Lanes of the last ``forward`` whose job must end (lane -> why): a grammar whose masks
        have taken longer than the engine allows one request to hold every lane up."""
        ...


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


def swap_keys(lanes: dict[int, Any], a: int, b: int) -> None:
    """Lanes ``a`` and ``b`` trade their entries in a per-lane dict, either possibly absent."""
    va, vb = lanes.pop(a, None), lanes.pop(b, None)
    if va is not None:
        lanes[b] = va
    if vb is not None:
        lanes[a] = vb


def _check(seq: int, limit: int, what: str) -> None:
    if not 0 <= seq < limit:
        raise EngineError(f"{what} {seq} out of range", permanent=True)


def _fill(engine: TickPrimitives, result: TickResult, seq: int, copy: Callable[..., None], *args: Any) -> None:
    """``copy(*args)``, a state copy into ``seq``; if the engine cannot make it, ``seq`` is left
    empty and reported lost (``result.lost``): no job fails with it."""
    try:
        copy(*args)
    except EngineError:
        engine.clear(seq)
        result.lost.add(seq)


def run_tick(
    engine: TickPrimitives, plan: TickPlan, should_stop: Callable[[], bool], clock: Callable[[], float] = time.perf_counter
) -> TickResult:
    """One tick, the same order for every engine: evict, drop and store cached prefixes; release,
    keep and park lanes; trim kept lanes; swap lanes; restore parked lanes; import and copy prefixes; bind samplers; then forward
    the feeds step by step (:func:`pack_steps`), stopping between steps when ``should_stop()``
    says so. A step that fails raises its EngineError with ``partial`` set to what ran before. A
    state copy that fails fails no job: a park leaves its job unparked, an eviction its prefix
    out of host memory, and a store, move, restore, import or copy leaves its sequence empty
    (``result.lost``), the commit computing that lane's job again and dropping that slot's entry."""
    started = clock()
    result = TickResult()
    ops = plan.pool
    lanes, seqs = engine.n_lanes, engine.n_seqs
    for slot, key in ops.evict:
        _check(slot, seqs, "sequence")
        try:
            result.evicted[key] = engine.save(slot)
        except EngineError:
            pass  # not moved to host memory: the commit drops that cache entry, no job fails
        engine.clear(slot)
    for slot in ops.drop:
        _check(slot, seqs, "sequence")
        engine.clear(slot)
    for lane, slot, n in ops.store:
        _check(lane, seqs, "sequence")
        _check(slot, seqs, "sequence")
        _fill(engine, result, slot, engine.copy_prefix, lane, slot, n)  # not stored: the commit drops its entry
    for lane in plan.release:
        _check(lane, lanes, "lane")
        engine.clear(lane)
        engine.drop_sampler(lane)
    for lane in plan.keep:
        _check(lane, lanes, "lane")
        engine.drop_sampler(lane)
    for lane, job_id in plan.park:
        _check(lane, lanes, "lane")
        try:
            result.parked[job_id] = engine.save(lane)
        except EngineError:
            pass  # a park the engine could not make: the commit computes that job again, no other fails
        engine.clear(lane)
        engine.drop_sampler(lane)
    for lane, n in plan.trim:
        _check(lane, lanes, "lane")
        if n > 0:
            engine.trim(lane, n)
        else:
            engine.clear(lane)
    for swap in plan.swap:
        _check(swap.a, lanes, "lane")
        _check(swap.b, lanes, "lane")
        try:
            moving = engine.save(swap.a)
            kept = engine.save(swap.b) if swap.b_kept else None
            engine.clear(swap.a)
            engine.clear(swap.b)
            engine.load(swap.b, moving)
            if kept is not None:
                engine.load(swap.a, kept)
        except EngineError:
            # a move the engine could not copy: both lanes are emptied, the moved job is
            # computed again in its new lane and the kept KV is forgotten; no other job fails
            engine.clear(swap.a)
            engine.clear(swap.b)
            result.lost.update((swap.a, swap.b))
        engine.swap_samplers(swap.a, swap.b)
    for restore in plan.restore:
        _check(restore.lane, lanes, "lane")
        # not restored: the commit computes that job again from its prompt and tokens so far, as after a failed park
        _fill(engine, result, restore.lane, engine.load, restore.lane, restore.artifact)
    for slot, artifact in ops.imports:
        _check(slot, seqs, "sequence")
        # not loaded back: the commit drops its entry, the lanes that were to copy it prefill their prompts
        _fill(engine, result, slot, engine.load, slot, artifact)
    for src, dst, n in ops.copy:
        _check(src, seqs, "sequence")
        _check(dst, seqs, "sequence")
        if src in result.lost:  # a lane or slot whose load failed holds none of what was to be copied
            engine.clear(dst)
            result.lost.add(dst)
            continue
        _fill(engine, result, dst, engine.copy_prefix, src, dst, n)  # not copied: that lane prefills its prompt itself
    for bind in plan.bind:
        _check(bind.lane, lanes, "lane")
        engine.bind_sampler(bind)
    if result.lost:  # their jobs' feeds start where their KV was to be: fed at the next tick
        plan = dataclasses.replace(plan, feeds=[f for f in plan.feeds if f.lane not in result.lost])
    if plan.feeds:
        cap = min(plan.step_tokens, engine.max_step_tokens)
        for step in pack_steps(plan, cap, lanes, engine.bound_lanes()):
            t = clock()
            try:
                sampled = engine.forward(step)
            except StepAborted:
                # rolled back: the tick ends as if it had stopped before this step
                result.stopped_early = True
                break
            except EngineError as error:
                error.partial = result  # earlier steps of this tick are in the KV cache
                raise
            if step.prefill:
                result.prefill_s += clock() - t
            for piece in step.pieces:
                result.fed[piece.lane] = result.fed.get(piece.lane, 0) + len(piece.tokens)
            _take_sampled(engine, result, sampled)
            if not step.last and should_stop():
                result.stopped_early = True
                break
        if plan.rounds > 1 and not result.stopped_early:
            _burst(engine, plan, result, should_stop)
    result.elapsed_s = clock() - started
    return result


def _burst(engine: TickPrimitives, plan: TickPlan, result: TickResult, should_stop: Callable[[], bool]) -> None:
    """A burst plan's further decode rounds (``plan.rounds``, every feed a decoding lane's one
    token): each lane's token just sampled is fed back at once, with no plan and commit between
    (their Python costs a few percent of a one-stream round). Ends after the round where a lane's
    token ends its generation, or the engine ends a lane, or when ``should_stop()`` says so
    before a round (an arrival, a cancel): the scheduler then sees the tokens as one tick's."""
    starts = {f.lane: f.start_pos + 1 for f in plan.feeds}
    for _ in range(plan.rounds - 1):
        if result.eog or result.failed or should_stop():
            return
        step = Step([Piece(lane, starts[lane], [result.sampled[lane]], True) for lane in sorted(starts)], False, True)
        try:
            sampled = engine.forward(step)
        except EngineError as error:
            error.partial = result  # the rounds before this one are in the KV cache
            raise
        result.rounds += 1
        for lane in starts:
            starts[lane] += 1
            result.fed[lane] += 1
        for lane in sampled:  # every lane (forward samples each piece that asks)
            result.earlier.setdefault(lane, []).append(result.sampled[lane])
        _take_sampled(engine, result, sampled)


def _take_sampled(engine: TickPrimitives, result: TickResult, sampled: dict[int, int]) -> None:
    """An engine step's sampled tokens into the tick's result, with the lanes they end, and
    what the engine noted in the step (logprobs, lanes it ends)."""
    for lane, token in sampled.items():
        result.sampled[lane] = token
        if engine.is_eog(token):
            result.eog.add(lane)
    result.logprobs.update(engine.take_logprobs())
    result.failed.update(engine.take_failed())


class LaneEngine:
    """What the real engines (llama.cpp, MLX) share around :func:`run_tick`: their sequences are
    the lanes, then the cache slots, and a closed engine refuses all work."""

    n_lanes: int
    cache_slots: int
    _closed: bool
    bos_id: int | None
    bos_text: str
    _add_bos: bool
    _pieces: dict[int, bytes]

    def _set_lanes(self, n_lanes: int, lane_ctx: int, max_step_tokens: int, cache_slots: int) -> None:
        """Check and keep the lane geometry; the engine counts as closed until its constructor
        has everything a close() would free."""
        if n_lanes < 1:
            raise ValueError("n_lanes must be at least 1")
        if lane_ctx < 16:
            raise ValueError("lane_ctx must be at least 16")
        if max_step_tokens < n_lanes:
            # Every decoding lane must fit in the first call of a tick.
            raise ValueError("max_step_tokens must be at least n_lanes")
        self.n_lanes = n_lanes
        self.cache_slots = cache_slots  # extra sequences after the lanes, for cached prefixes
        self.lane_ctx = lane_ctx
        self.max_step_tokens = max_step_tokens
        self._closed = True

    def execute(self, plan: TickPlan, should_stop: Callable[[], bool]) -> TickResult:
        self._require_open()
        return run_tick(self, plan, should_stop)  # type: ignore[arg-type]  # a subclass has the primitives

    @property
    def n_seqs(self) -> int:
        return self.n_lanes + self.cache_slots

    def _require_open(self) -> None:
        # Every native call after close() would touch freed memory; fail in Python instead.
        if self._closed:
            raise EngineError("engine is closed", permanent=True)

    def _with_bos(self, text: str, tokens: list[int], add_special: bool) -> list[int]:
        """``tokens`` of ``text``, after a BOS when the vocabulary asks for one, ``add_special``
        allows it and the text does not start with it already (BOS once, never EOS)."""
        return bos_once(tokens, text, add_special=add_special, add_bos=self._add_bos, bos_id=self.bos_id, bos_text=self.bos_text)

    def token_bytes(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._token_piece(token)
            self._pieces[token] = piece
        return piece

    def _token_piece(self, token: int) -> bytes:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
