"""The llama.cpp engine against the real SmolLM2-135M model, driven with hand-built TickPlans.

``drive`` (``bench/engine_driver.py``) plays the scheduler's part (bind, feed the unfed part of
prompt + output, commit what was fed and sampled), so each test states what the engine must do, not how a scheduler
would ask for it. ``reference`` holds greedy continuations generated alone on a fresh engine;
batching, chunking, parking and lane reuse must all reproduce them token for token.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench.engine_driver import GREEDY, Run, chat, drive, generate, never, release, text_of
from scheduler.core.types import (
    LaneBind,
    LaneFeed,
    LaneRestore,
    SamplingParams,
    TickPlan,
)
from scheduler.engines.base import EngineError
from scheduler.engines.llama_cpp import LlamaCppEngine, ParkedKV
from scheduler.engines.models import default_model_path

pytestmark = pytest.mark.model

Engine = LlamaCppEngine
N_LANES = 4
N_TOKENS = 32  # the length of the reference continuations
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in simple terms.",
    "List three prime numbers.",
]


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    eng = LlamaCppEngine(default_model_path(), n_lanes=N_LANES, lane_ctx=1024)
    yield eng
    eng.close()


@pytest.fixture(autouse=True)
def clean_lanes(engine: Engine) -> Iterator[None]:
    yield
    release(engine, *range(N_LANES))


@pytest.fixture(scope="module")
def prompts(engine: Engine) -> list[list[int]]:
    return [chat(engine, q) for q in QUESTIONS]


@pytest.fixture(scope="module")
def reference(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy 32-token continuations, each generated alone in lane 0 of a fresh engine."""
    outputs = []
    for p in prompts:
        outputs.append(generate(engine, 0, p, max_tokens=N_TOKENS))
        release(engine, 0)
    return outputs


# -- model facts and text -------------------------------------------------------------------


def test_attributes(engine: Engine) -> None:
    assert (engine.name, engine.n_lanes, engine.lane_ctx) == ("llamacpp", N_LANES, 1024)
    assert (engine.n_ctx_train, engine.vocab_size) == (8192, 49152)
    assert (engine.bos_text, engine.eos_text) == ("<|im_start|>", "<|im_end|>")
    assert engine.fim_tokens() is None  # SmolLM2 has no FIM tokens
    assert engine.is_eog(2) and not engine.is_eog(engine.tokenize("Paris")[0])


def test_chat_template_is_smollm_chatml(engine: Engine) -> None:
    text = engine.render_chat([{"role": "user", "content": "Hi there"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert "<|im_start|>user\nHi there<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    own = engine.render_chat(
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]
    )
    assert own == (
        "<|im_start|>system\nBe terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_template_raise_exception_is_value_error(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "chat_template", "{{ raise_exception('roles must alternate') }}")
    monkeypatch.setattr(engine, "_template", None)
    with pytest.raises(ValueError, match="roles must alternate"):
        engine.render_chat([{"role": "user", "content": "x"}])


def test_tokenize_parses_special_tokens_without_adding_bos(engine: Engine) -> None:
    tokens = engine.tokenize("<|im_start|>user\nHi<|im_end|>")
    assert tokens[0] == 1 and tokens[-1] == 2 and tokens.count(1) == 1
    # SmolLM2's vocab does not ask for BOS, so add_special changes nothing here
    assert engine.tokenize("Hi", add_special=False) == engine.tokenize("Hi")


def test_tokenize_adds_bos_once_when_the_vocab_wants_it(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "_add_bos", True)
    assert engine.tokenize("Hi")[0] == engine.bos_id
    assert engine.tokenize("Hi", add_special=False)[0] != engine.bos_id
    assert engine.tokenize("<|im_start|>Hi").count(engine.bos_id) == 1


def test_token_bytes_reassemble_multibyte_utf8(engine: Engine) -> None:
    text = "héllo 你好 🙂"
    tokens = engine.tokenize(text, add_special=False)
    pieces = [engine.token_bytes(t) for t in tokens]
    assert b"".join(pieces) == text.encode("utf-8")
    # some token is a fragment of a character: bytes, not text, is the right unit
    assert any(not _is_utf8(p) for p in pieces)
    assert engine.token_bytes(2) == b""  # <|im_end|> is a control token
    assert engine.token_bytes(tokens[0]) is engine.token_bytes(tokens[0])  # cached


def _is_utf8(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# -- generation -----------------------------------------------------------------------------


def test_greedy_answers_paris_and_stops_at_eog(engine: Engine, prompts: list[list[int]]) -> None:
    run = drive(engine, [Run(0, prompts[0], max_tokens=64, stop_on_eog=True)])[0]
    assert run.done and len(run.output) < 64  # ended by end-of-generation, not by length
    assert "Paris" in text_of(engine, run.output)


def test_batched_greedy_matches_alone(
    engine: Engine, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    # all four prompts prefilled in one call, then decoded together
    together = drive(engine, [Run(i, prompts[i], max_tokens=N_TOKENS) for i in range(N_LANES)])
    assert [r.output for r in together] == reference
    release(engine, *range(N_LANES))
    # staggered: lane 3 prefills in 7-token chunks while lanes 0-2 are mid-decode, in 8-token
    # engine calls, so lanes' tokens share calls in shifting combinations and cross call
    # boundaries
    early = [Run(i, prompts[i], max_tokens=N_TOKENS) for i in range(3)]
    drive(engine, early, ticks=5)
    late = Run(3, prompts[3], max_tokens=N_TOKENS)
    drive(engine, [*early, late], chunk=7, step_tokens=8)
    assert [r.output for r in early] == reference[:3]
    assert late.output == reference[3]


def test_lane_number_does_not_matter(
    engine: Engine, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    assert generate(engine, 2, prompts[1], max_tokens=N_TOKENS) == reference[1]


def test_release_then_reuse_matches_fresh(
    engine: Engine, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    generate(engine, 1, prompts[2], max_tokens=8)
    release(engine, 1)
    assert generate(engine, 1, prompts[0], max_tokens=N_TOKENS) == reference[0]


def test_park_and_restore_into_another_lane_continues_exactly(
    engine: Engine, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    run = Run(0, prompts[0], max_tokens=N_TOKENS)
    drive(engine, [run], ticks=10)
    assert len(run.output) == 10 and run.computed == len(prompts[0]) + 9
    result = engine.execute(TickPlan(tick=11, park=[(0, "a")]), never)
    parked = result.parked["a"]
    assert isinstance(parked, ParkedKV)
    assert parked.n_tokens == run.computed and parked.nbytes == len(parked.data) > 0
    # lane 0 is empty again: another job starts there at position 0 and runs normally
    assert generate(engine, 0, prompts[1], max_tokens=6) == reference[1][:6]
    run.lane = 2
    plan = TickPlan(
        tick=12,
        restore=[LaneRestore(2, "a", parked)],
        bind=[LaneBind(2, "a", GREEDY, list(run.output))],
        feeds=[run.feed()],
    )
    run.commit(engine.execute(plan, never))
    drive(engine, [run])
    assert run.output == reference[0]


def test_restore_of_garbage_raises(engine: Engine) -> None:
    plan = TickPlan(tick=1, restore=[LaneRestore(1, "x", ParkedKV(b"\x00" * 64, 3))])
    with pytest.raises(EngineError):
        engine.execute(plan, never)


def test_should_stop_returns_partial_feed_without_sample(
    engine: Engine, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    decoding = Run(0, prompts[0], max_tokens=N_TOKENS)
    drive(engine, [decoding], ticks=2)
    prefilling = Run(1, prompts[2], max_tokens=N_TOKENS, bound=True)
    asked: list[bool] = []

    def stop() -> bool:
        asked.append(True)
        return True

    plan = TickPlan(
        tick=3,
        step_tokens=16,
        bind=[LaneBind(1, "p", GREEDY)],
        feeds=[prefilling.feed(), decoding.feed()],  # the decode feed listed last on purpose
    )
    result = engine.execute(plan, stop)
    assert result.stopped_early and len(asked) == 1
    # the decode token went first; the prompt filled the rest of the 16-token call
    assert result.fed == {0: 1, 1: 15}
    assert set(result.sampled) == {0}  # the lane cut short got no sample
    assert result.prefill_s > 0 and result.elapsed_s >= result.prefill_s
    decoding.commit(result)
    prefilling.commit(result)
    drive(engine, [decoding, prefilling])  # resumes lane 1 from position 15
    assert decoding.output == reference[0]
    assert prefilling.output == reference[2]


def test_should_stop_not_asked_when_one_call_suffices(
    engine: Engine, prompts: list[list[int]]
) -> None:
    asked: list[bool] = []

    def stop() -> bool:
        asked.append(True)
        return True

    first = TickPlan(
        tick=1, bind=[LaneBind(0, "a", GREEDY)], feeds=[LaneFeed(0, "a", 0, prompts[0], True)]
    )
    result = engine.execute(first, stop)
    assert not asked and not result.stopped_early and 0 in result.sampled
    assert result.fed == {0: len(prompts[0])} and result.prefill_s > 0
    token = result.sampled[0]
    decode = engine.execute(
        TickPlan(tick=2, feeds=[LaneFeed(0, "a", len(prompts[0]), [token], True, decode=True)]), never
    )
    assert decode.fed == {0: 1} and decode.prefill_s == 0.0 and decode.elapsed_s > 0


def test_seeded_sampling_repeats(engine: Engine, prompts: list[list[int]]) -> None:
    hot = SamplingParams(temperature=0.8, seed=1234)
    first = generate(engine, 0, prompts[1], hot, 24)
    release(engine, 0)
    # the same seed in two lanes at once: each lane has its own sampler and RNG
    pair = drive(engine, [Run(1, prompts[1], hot, 24), Run(2, prompts[1], hot, 24)])
    assert pair[0].output == first and pair[1].output == first
    release(engine, 1, 2)
    others = [
        generate(engine, 1 + s, prompts[1], SamplingParams(temperature=0.8, seed=s), 24)
        for s in (1, 2)
    ]
    assert any(o != first for o in others)  # the seed is really used


def test_repeat_penalty_changes_greedy_output(
    engine: Engine, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    penalised = generate(engine, 0, prompts[0], SamplingParams(temperature=0.0, repeat_penalty=1.5), N_TOKENS)
    assert len(penalised) == 32 and penalised != reference[0]


def test_bad_position_is_a_permanent_error(engine: Engine, prompts: list[list[int]]) -> None:
    first = TickPlan(
        tick=1, bind=[LaneBind(0, "a", GREEDY)], feeds=[LaneFeed(0, "a", 0, prompts[0], True)]
    )
    engine.execute(first, never)
    gap = TickPlan(tick=2, feeds=[LaneFeed(0, "a", len(prompts[0]) + 5, [42], True)])
    with pytest.raises(EngineError) as info:
        engine.execute(gap, never)
    assert info.value.permanent
    assert info.value.partial.fed == {}  # type: ignore[attr-defined]  # nothing got in
    assert "inconsistent sequence positions" in str(info.value)  # llama.cpp's own reason


def test_close_is_idempotent_and_final() -> None:
    eng = LlamaCppEngine(default_model_path(), n_lanes=1, lane_ctx=256, max_step_tokens=64)
    assert eng.tokenize("Hi")
    eng.close()
    eng.close()
    with pytest.raises(EngineError):
        eng.tokenize("Hi")
    with pytest.raises(EngineError):
        eng.execute(TickPlan(tick=1), never)


# -- prompt scoring (completions echo + logprobs) ---------------------------------------------


def test_scoring_a_greedy_continuation_finds_each_token_the_likeliest(
    engine: Engine, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    tokens = prompts[0] + reference[0]
    scored = engine.score_prompt(tokens, 2)
    assert len(scored) == len(tokens) - 1
    assert all(lp <= 0 and len(alts) == 2 for lp, alts in scored)
    for i, token in enumerate(reference[0]):  # greedy: each was the argmax where it was drawn
        lp, alts = scored[len(prompts[0]) - 1 + i]
        assert alts[0][0] == token and lp == pytest.approx(alts[0][1])


def test_scoring_a_prompt_longer_than_one_batch_sees_all_of_it(engine: Engine) -> None:
    sentence = engine.tokenize("The quick brown fox jumps over the lazy dog. ", add_special=False)
    tokens = sentence * (700 // len(sentence) + 1)  # more than the 512-token chunk
    scored = engine.score_prompt(tokens, 0)
    assert len(scored) == len(tokens) - 1
    first = sum(lp for lp, _ in scored[: len(sentence) - 1])
    late = sum(lp for lp, _ in scored[-(len(sentence) - 1):])
    assert late > first / 4  # by the last repetition (past the chunk) the model has seen it many times
