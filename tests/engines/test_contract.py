"""The engine contract, run against every engine on the real SmolLM2-135M: llama.cpp from the
bundled GGUF, MLX from the same GGUF converted by ``manage.py mlxconvert``'s code. What only
llama.cpp does (prompt scoring, its own KV state bytes) is tested here too, on the same engine.

``reference`` holds greedy continuations generated alone in lane 0; batching, chunked prefill,
parking, lane reuse and prefix copies must all reproduce them token for token on the same
engine. MLX runs the float32 conversion (``mlx_float_dir``: its products go through BLAS,
many times faster on MLX's CPU backend than the quantised kernel); token counts stay small.
"""

from __future__ import annotations

import ctypes
import json
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from scheduler.core.kv_pool import PoolOps, common_prefix
from scheduler.core.scheduler import SchedulerConfig
from scheduler.core.types import LaneBind, LaneFeed, LaneRestore, LaneSwap, SamplingParams, TickPlan, TickResult
from scheduler.engines.base import EngineError, Step, StepAborted
from scheduler.engines.grammar import schema_grammar, tool_grammar
from scheduler.link.messages import Cancel, Delta, Done, Error, Message, Submit
from scheduler.worker.loop import EngineWorker
from scheduler.worker.output import TextStream
from testkit.engine_driver import GREEDY, Run, chat, drive, generate, never, release, text_of

pytestmark = pytest.mark.model

N_LANES, SLOTS, LANE_CTX = 3, 2, 1024  # 1024: a scored prompt can span two 512-token chunks
SLOT0 = N_LANES  # the first cache slot's sequence id
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
]
N_TOKENS = 8


def _llamacpp(_request: pytest.FixtureRequest) -> Any:
    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.engines.models import default_model_path

    return LlamaCppEngine(default_model_path(), n_lanes=N_LANES, lane_ctx=LANE_CTX, cache_slots=SLOTS)


def _mlx(request: pytest.FixtureRequest) -> Any:
    folder: Path = request.getfixturevalue("mlx_float_dir")
    from scheduler.engines.mlx import MlxEngine

    return MlxEngine(folder, n_lanes=N_LANES, lane_ctx=LANE_CTX, cache_slots=SLOTS)


@pytest.fixture(scope="module", params=["llamacpp", "mlx"])
def engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    eng = {"llamacpp": _llamacpp, "mlx": _mlx}[request.param](request)
    with closing(eng):
        yield eng


@pytest.fixture(autouse=True)
def clean_lanes(engine: Any) -> Iterator[None]:
    yield
    engine.execute(TickPlan(tick=0, release=list(range(N_LANES)), pool=PoolOps(drop=[SLOT0, SLOT0 + 1])), never)


@pytest.fixture(scope="module")
def prompts(engine: Any) -> list[list[int]]:
    return [chat(engine, q) for q in QUESTIONS]


@pytest.fixture(scope="module")
def reference(engine: Any, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy continuations, each generated alone in lane 0."""
    outputs = []
    for p in prompts:
        outputs.append(generate(engine, 0, p, max_tokens=N_TOKENS))
        release(engine, 0)
    return outputs


# -- text -----------------------------------------------------------------------------------


def test_engine_describes_itself(engine: Any) -> None:
    assert engine.name in ("llamacpp", "mlx")
    assert (engine.n_lanes, engine.lane_ctx, engine.vocab_size) == (N_LANES, LANE_CTX, 49152)
    assert engine.n_ctx_train == 8192
    assert (engine.bos_text, engine.eos_text) == ("<|im_start|>", "<|im_end|>")
    assert engine.fim_tokens() is None  # SmolLM2 has no FIM tokens
    # POST /infill's repo-level markers: llama.cpp finds StarCoder's <reponame> (id 4) as FIM_REP,
    # and no FIM_SEP (its <file_sep>, id 5, is not given that role); MLX's lookup by text agrees
    assert engine.fim_repo_tokens() == (None, 4)
    assert engine.is_eog(2) and not engine.is_eog(engine.tokenize("Paris")[0])


def test_a_reply_ends_on_the_tokens_llama_cpp_ends_it_on(engine: Any) -> None:
    """llama.cpp's vocabulary ends generation on EOS/EOT and also on its FIM pad, repository and
    file-separator tokens: SmolLM2's <reponame> (id 4). MLX did not, so a greedy reply that
    reached it ended on llama.cpp and ran on (printing nothing for it) on MLX, and ignore_eos
    banned it on one engine only."""
    assert [t for t in range(engine.vocab_size) if engine.is_eog(t)] == [0, 2, 4]


def test_render_chat_applies_the_models_template(engine: Any) -> None:
    assert engine.render_chat([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    default = engine.render_chat([{"role": "user", "content": "Hi"}])
    assert default.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_a_templates_raise_exception_is_a_value_error(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "chat_template", "{{ raise_exception('roles must alternate') }}")
    monkeypatch.setattr(engine, "_template", None)
    with pytest.raises(ValueError, match="roles must alternate"):
        engine.render_chat([{"role": "user", "content": "x"}])


def test_tokenize_parses_special_tokens_and_adds_no_bos(engine: Any) -> None:
    tokens = engine.tokenize("<|im_start|>user\nHi<|im_end|>")
    assert tokens[0] == 1 and tokens[-1] == 2 and tokens.count(1) == 1
    assert engine.tokenize("Hi", add_special=False) == engine.tokenize("Hi")


def test_tokenize_adds_bos_once_when_the_vocab_wants_it(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "_add_bos", True)
    assert engine.tokenize("Hi")[0] == engine.bos_id
    assert engine.tokenize("Hi", add_special=False)[0] != engine.bos_id
    assert engine.tokenize("<|im_start|>Hi").count(engine.bos_id) == 1


def test_tokenize_without_special_keeps_control_token_text_as_text(engine: Any) -> None:
    """What a client wrote is tokenised with special=False: ``<|im_end|>`` there is not token 2."""
    tokens = engine.tokenize("Hi<|im_end|><|im_start|>system", add_special=False, special=False)
    assert 1 not in tokens and 2 not in tokens
    assert b"".join(engine.token_bytes(t) for t in tokens) == b"Hi<|im_end|><|im_start|>system"


def test_token_bytes_reassemble_multibyte_utf8(engine: Any) -> None:
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


def test_greedy_answers_paris_and_stops_at_eog(engine: Any, prompts: list[list[int]]) -> None:
    run = drive(engine, [Run(0, prompts[0], max_tokens=16, stop_on_eog=True)])[0]
    assert run.done and len(run.output) < 16  # ended by end-of-generation, not by length
    assert text_of(engine, run.output) == "The capital of France is Paris."


def test_greedy_is_deterministic(engine: Any, prompts: list[list[int]], reference: list[list[int]]) -> None:
    assert generate(engine, 0, prompts[0], max_tokens=N_TOKENS) == reference[0]


def test_lanes_batched_in_one_tick_give_what_each_gives_alone(
    engine: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    together = drive(engine, [Run(i, prompts[i], max_tokens=N_TOKENS) for i in range(N_LANES)])
    assert [r.output for r in together] == reference


def test_chunked_prefill_beside_decoding_lanes_gives_the_same_tokens(
    engine: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    # lane 2 prefills in 7-token chunks while lanes 0-1 are mid-decode, in 8-token steps, so
    # lanes share steps in shifting combinations and cross step boundaries
    early = [Run(i, prompts[i], max_tokens=N_TOKENS) for i in range(2)]
    drive(engine, early, ticks=3)
    late = Run(2, prompts[2], max_tokens=N_TOKENS)
    drive(engine, [*early, late], chunk=7, step_tokens=8)
    assert [r.output for r in early] == reference[:2]
    assert late.output == reference[2]


def test_a_released_lane_is_free_for_a_new_job(
    engine: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    generate(engine, 1, prompts[2], max_tokens=3)
    release(engine, 1)
    assert generate(engine, 1, prompts[0], max_tokens=N_TOKENS) == reference[0]


def test_park_and_restore_into_another_lane_continues_exactly(
    engine: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    run = Run(0, prompts[0], max_tokens=N_TOKENS)
    drive(engine, [run], ticks=4)
    assert len(run.output) == 4 and run.computed == len(prompts[0]) + 3
    parked = engine.execute(TickPlan(tick=5, park=[(0, "a")]), never).parked["a"]
    assert parked.n_tokens == run.computed and parked.nbytes > 0
    # lane 0 is empty again: another job starts there at position 0 and runs normally
    assert generate(engine, 0, prompts[1], max_tokens=2) == reference[1][:2]
    run.lane = 2
    plan = TickPlan(
        tick=6,
        restore=[LaneRestore(2, "a", parked)],
        bind=[LaneBind(2, "a", GREEDY, list(run.output))],
        feeds=[run.feed()],
    )
    run.commit(engine.execute(plan, never))
    drive(engine, [run])
    assert run.output == reference[0]


def test_a_job_swapped_into_a_kept_lane_continues_exactly_and_the_kept_kv_moves_up(
    engine: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    """A lane swap (the scheduler's lane compaction): the job's KV and its sampler as they are,
    random state and all, go to the lower lane; the kept KV there goes to the job's old lane."""
    seeded = SamplingParams(temperature=0.9, seed=11)
    alone = generate(engine, 2, prompts[2], seeded, max_tokens=N_TOKENS)
    release(engine, 2)
    kept = drive(engine, [Run(1, prompts[1], max_tokens=4)])[0]
    engine.execute(TickPlan(tick=1, keep=[1]), never)  # lane 1: a finished job's KV, no sampler
    job = Run(2, prompts[2], seeded, N_TOKENS)
    drive(engine, [job], ticks=4)
    engine.execute(TickPlan(tick=5, swap=[LaneSwap(2, 1, True)]), never)
    job.lane = 1
    drive(engine, [job])
    assert job.output == alone  # the seeded sampler moved with its state
    # lane 2 now holds the kept KV: its conversation goes on from there
    follow = Run(2, prompts[1], max_tokens=N_TOKENS, output=list(kept.output), computed=kept.computed)
    drive(engine, [follow])
    assert follow.output == reference[1]


@pytest.mark.parametrize("constrained", [False, True], ids=["free", "schema"])
def test_a_seeded_reply_parked_and_resumed_in_another_lane_is_the_reply_it_gives_undisturbed(
    engine: Any, prompts: list[list[int]], constrained: bool
) -> None:
    """Preemption does not change a seeded reply: bound again with its park artifact, the lane's
    random stream goes on past the draws it made (on llama.cpp a constrained pick the grammar
    rejected draws twice), where it restarted from the seed before."""
    if constrained:
        hot = SamplingParams(temperature=1.0, seed=77, grammar=schema_grammar(SMALL_PERSON))
        prompt = chat(engine, "Describe a person as JSON.")
    else:
        hot, prompt = SamplingParams(temperature=1.0, seed=77), prompts[1]
    alone = drive(engine, [Run(0, prompt, hot, 16, stop_on_eog=True)])[0].output
    release(engine, 0)
    run = Run(0, prompt, hot, 16, stop_on_eog=True)
    drive(engine, [run], ticks=6)
    assert len(run.output) == 6 and not run.done
    parked = engine.execute(TickPlan(tick=7, park=[(0, "s")]), never).parked["s"]
    if constrained and hasattr(parked, "extra_draws"):
        assert parked.extra_draws > 0  # llama.cpp: a pick the grammar rejected drew twice
    run.lane, run.bound = 2, True
    plan = TickPlan(tick=8, restore=[LaneRestore(2, "s", parked)], bind=[LaneBind(2, run.job, hot, list(run.output), parked)], feeds=[run.feed()])
    run.commit(engine.execute(plan, never))
    drive(engine, [run])
    assert run.output == alone


def test_restoring_something_that_is_not_this_engines_park_artifact_loses_that_lane_only(engine: Any) -> None:
    """The engine's load refuses it; the tick does not fail: it reports the lane lost (its job
    is computed again: docs/scheduling.md)."""
    with pytest.raises(EngineError):
        engine.load(1, object())
    result = engine.execute(TickPlan(tick=1, restore=[LaneRestore(1, "x", object())]), never)
    assert result.lost == {1}


def test_should_stop_ends_the_tick_at_the_next_step_and_resumes_exactly(
    engine: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    decoding = Run(0, prompts[0], max_tokens=N_TOKENS)
    drive(engine, [decoding], ticks=2)
    prefilling = Run(1, prompts[2], bound=True, max_tokens=N_TOKENS)
    asked: list[bool] = []

    def stop() -> bool:
        asked.append(True)
        return True

    plan = TickPlan(
        tick=3,
        step_tokens=16,
        bind=[LaneBind(1, prefilling.job, GREEDY)],
        feeds=[prefilling.feed(), decoding.feed()],  # the decode feed listed last on purpose
    )
    result = engine.execute(plan, stop)
    assert result.stopped_early and len(asked) == 1
    # the decode token went first; the prompt filled the rest of the 16-token step
    assert result.fed == {0: 1, 1: 15}
    assert set(result.sampled) == {0}  # the lane cut short got no sample
    assert result.prefill_s > 0 and result.elapsed_s >= result.prefill_s
    decoding.commit(result)
    prefilling.commit(result)
    drive(engine, [decoding, prefilling])  # resumes lane 1 from position 15
    assert decoding.output == reference[0]
    assert prefilling.output == reference[2]


def test_should_stop_is_not_asked_when_one_step_suffices(engine: Any, prompts: list[list[int]]) -> None:
    asked: list[bool] = []

    def stop() -> bool:
        asked.append(True)
        return True

    first = TickPlan(tick=1, bind=[LaneBind(0, "a", GREEDY)], feeds=[LaneFeed(0, "a", 0, prompts[0], True)])
    result = engine.execute(first, stop)
    assert not asked and not result.stopped_early and 0 in result.sampled
    assert result.fed == {0: len(prompts[0])} and result.prefill_s > 0
    token = result.sampled[0]
    decode = engine.execute(TickPlan(tick=2, feeds=[LaneFeed(0, "a", len(prompts[0]), [token], True, decode=True)]), never)
    assert decode.fed == {0: 1} and decode.prefill_s == 0.0 and decode.elapsed_s > 0


def test_seeded_sampling_repeats_per_lane_and_the_seed_matters(engine: Any, prompts: list[list[int]]) -> None:
    hot = SamplingParams(temperature=1.0, seed=1234)
    first = generate(engine, 0, prompts[1], hot, N_TOKENS)
    release(engine, 0)
    # the same seed in two lanes at once: each lane has its own sampler and random stream
    pair = drive(engine, [Run(1, prompts[1], hot, N_TOKENS), Run(2, prompts[1], hot, N_TOKENS)])
    assert pair[0].output == first and pair[1].output == first
    release(engine, 1, 2)
    others = drive(engine, [Run(s, prompts[1], SamplingParams(temperature=1.0, seed=s), N_TOKENS) for s in (1, 2)])
    assert any(o.output != first for o in others)
    release(engine, 1, 2)
    # a top_k of at least the vocabulary is no limit: 2**32 + 1 reached llama.cpp's int32_t as 1
    # (greedy); the same seed samples the same tokens as without top_k
    unlimited = drive(engine, [Run(s, prompts[1], SamplingParams(temperature=1.0, seed=1234, top_k=k), N_TOKENS)
                               for s, k in ((1, engine.vocab_size), (2, 2**32 + 1))])
    assert [u.output for u in unlimited] == [first, first]
    release(engine, 1, 2)


@pytest.mark.parametrize("temperature", [1e-39, 1e-44])
def test_a_temperature_too_small_to_divide_the_logits_by_gives_the_greedy_reply(
    engine: Any, prompts: list[list[int]], reference: list[list[int]], temperature: float
) -> None:
    """The API takes any temperature in [0, 2]; on llama.cpp the float32 logits divided by 1e-39
    overflowed and the draw's NaN probabilities gave garbage ("ectableectable...")."""
    tiny = SamplingParams(temperature=temperature, seed=5)
    assert generate(engine, 0, prompts[1], tiny, N_TOKENS) == reference[1]


def test_top_k_one_is_greedy_and_a_repeat_penalty_breaks_a_loop(
    engine: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    top1 = SamplingParams(temperature=0.7, top_k=1, top_p=0.9, min_p=0.05, seed=7)
    loop = engine.tokenize("1, 1, 1, 1, 1, 1, 1, 1, 1, 1,", add_special=False)
    penalised = SamplingParams(temperature=0.0, repeat_penalty=1.5, presence_penalty=0.5)
    runs = drive(
        engine,
        [Run(0, prompts[2], top1, N_TOKENS), Run(1, loop, GREEDY, N_TOKENS), Run(2, loop, penalised, N_TOKENS)],
    )
    assert runs[0].output == reference[2]
    assert text_of(engine, runs[1].output).startswith(" 1, 1,")
    assert runs[2].output != runs[1].output


def test_a_feed_at_the_wrong_position_is_a_permanent_error_and_changes_nothing(
    engine: Any, prompts: list[list[int]]
) -> None:
    engine.execute(TickPlan(tick=1, bind=[LaneBind(0, "a", GREEDY)], feeds=[LaneFeed(0, "a", 0, prompts[0], True)]), never)
    gap = TickPlan(tick=2, feeds=[LaneFeed(0, "a", len(prompts[0]) + 5, [42], True)])
    with pytest.raises(EngineError) as info:
        engine.execute(gap, never)
    assert info.value.permanent
    assert info.value.partial.fed == {}  # type: ignore[attr-defined]


def test_stop_strings_end_the_text_through_the_workers_text_stream(engine: Any, prompts: list[list[int]]) -> None:
    run = drive(engine, [Run(0, prompts[0], max_tokens=16, stop_on_eog=True)])[0]
    stream = TextStream(engine.token_bytes, stop=[" Paris"])
    text = ""
    for token in run.output:
        text += stream.push(token)
        if stream.stopped:
            break
    assert stream.stopped and text == "The capital of France is"


# -- the sampler chain's request features (logit bias, ignore_eos, logprobs, grammars) ----------

SMALL_PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_both_engines_declare_the_request_features(engine: Any) -> None:
    assert {"logit_bias", "ignore_eos", "typical_p", "grammar", "logprobs", "template_vars"} <= engine.features


def test_a_logit_bias_of_minus_100_keeps_a_token_out_and_ignore_eos_runs_to_max_tokens(
    engine: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    banned = SamplingParams(temperature=0.0, logit_bias=((reference[0][0], -100.0),))
    no_eos = SamplingParams(temperature=0.0, ignore_eos=True)
    runs = drive(
        engine,
        [Run(0, prompts[0], banned, N_TOKENS), Run(1, prompts[0], no_eos, 12, stop_on_eog=True), Run(2, prompts[0], GREEDY, 12, stop_on_eog=True)],
    )
    assert runs[0].output[0] != reference[0][0] and reference[0][0] not in runs[0].output
    assert len(runs[2].output) < 12  # free, the model ends its answer ...
    assert len(runs[1].output) == 12 and not any(engine.is_eog(t) for t in runs[1].output)  # ... banned, it cannot


def test_logprobs_are_the_raw_models_and_name_the_sampled_token(engine: Any, prompts: list[list[int]], reference: list[list[int]]) -> None:
    """Greedy with logprobs: each sample's logprob is the best of its top 3, which are sorted and
    are log-probabilities; a lane that did not ask gets none."""
    asks = Run(0, prompts[0], SamplingParams(temperature=0.0, logprobs=3), 4)
    quiet = Run(1, prompts[0], GREEDY, 4)
    seen: list[tuple[float, list[tuple[int, float]]]] = []
    for tick in range(1, 5):
        plan = TickPlan(tick=tick)
        for run in (asks, quiet):
            if not run.bound:
                plan.bind.append(LaneBind(run.lane, run.job, run.sampling))
                run.bound = True
            plan.feeds.append(run.feed())
        result = engine.execute(plan, never)
        assert set(result.logprobs) == {0}
        seen.append(result.logprobs[0])
        asks.commit(result)
        quiet.commit(result)
    assert asks.output == quiet.output == reference[0][:4]
    for token, (logprob, top) in zip(asks.output, seen, strict=True):
        assert [t for t, _ in top][0] == token and top[0][1] == pytest.approx(logprob)
        assert len(top) == 3 and [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
        assert all(lp <= 0 for _, lp in top) and sum(math.exp(lp) for _, lp in top) <= 1.0 + 1e-6


def test_a_schema_grammar_gives_json_that_fits_batched_beside_a_free_lane_and_across_parking(
    engine: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    grammar = SamplingParams(temperature=0.0, grammar=schema_grammar(SMALL_PERSON))
    question = chat(engine, "Describe a person as JSON.")
    assert engine.check_grammar(grammar.grammar) is None
    whole, free = drive(engine, [Run(0, question, grammar, 30, stop_on_eog=True), Run(1, prompts[0], GREEDY, N_TOKENS)])
    assert free.output == reference[0]  # the constrained lane beside it changes nothing
    reply = json.loads(text_of(engine, whole.output))
    assert set(reply) == {"name", "age"} and isinstance(reply["age"], int) and len(reply["name"]) <= 12
    release(engine, 0, 1)
    # parked after 5 tokens, resumed in another lane with its history replayed into the grammar
    run = Run(0, question, grammar, 30, stop_on_eog=True)
    drive(engine, [run], ticks=6)
    parked = engine.execute(TickPlan(tick=7, park=[(0, "g")]), never).parked["g"]
    run.lane, run.bound = 2, True
    plan = TickPlan(tick=8, restore=[LaneRestore(2, "g", parked)], bind=[LaneBind(2, run.job, grammar, list(run.output))], feeds=[run.feed()])
    run.commit(engine.execute(plan, never))
    drive(engine, [run])
    assert run.output == whole.output


def test_bounded_and_recursive_schemas_compile_and_the_bounds_hold(engine: Any) -> None:
    """A maxLength of 5,000 was 5,000 nested groups for llama.cpp's recursive parser (20,000
    crashed the worker); written as x{m,n} it compiles on both engines, and still binds."""
    for schema in ({"type": "string", "maxLength": 5000}, {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 5000}):
        assert engine.check_grammar(schema_grammar(schema)) is None
    from tests.engines.test_grammar import NODE, UI  # recursive schemas, which were 400s

    for schema in (UI, NODE):
        assert engine.check_grammar(schema_grammar(schema)) is None
    short = SamplingParams(temperature=0.0, grammar=schema_grammar({"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 2, "maxItems": 3}))
    run = drive(engine, [Run(0, chat(engine, "List some animals as a JSON array."), short, 40, stop_on_eog=True)])[0]
    reply = json.loads(text_of(engine, run.output))
    assert 2 <= len(reply) <= 3 and all(isinstance(a, str) and len(a) <= 3 for a in reply), reply
    release(engine, 0)


def test_a_named_tool_grammar_gives_a_call_that_parses(engine: Any) -> None:
    tools = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}}]
    sampling = SamplingParams(temperature=0.8, seed=3, grammar=tool_grammar(tools, {"name": "get_weather"}, True))
    run = drive(engine, [Run(0, chat(engine, "What is the weather in Paris?"), sampling, 80, stop_on_eog=True)])[0]
    text = text_of(engine, run.output)
    assert text.startswith("<tool_call>\n") and len(run.output) < 80  # the call closed and the reply ended
    # the closing tag may be a control token, which prints nothing
    call = json.loads(text.removeprefix("<tool_call>\n").split("\n</tool_call>")[0])
    assert call["name"] == "get_weather" and isinstance(call["arguments"]["city"], str)


# a tool's parameters as pydantic writes them for a nested model: the nested model in $defs
LOOKUP = {
    "name": "lookup",
    "parameters": {
        "$defs": {"Addr": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"]}},
        "type": "object",
        "properties": {"who": {"type": "string", "maxLength": 16}, "addr": {"$ref": "#/$defs/Addr"}},
        "required": ["who", "addr"],
    },
}


@pytest.mark.parametrize("choice", ["required", {"name": "lookup"}], ids=["required", "named"])
def test_a_forced_call_of_a_tool_whose_parameters_use_defs_fits_them(engine: Any, choice: Any) -> None:
    """Nested under a call, the parameters' "#/$defs/Addr" no longer resolved: a forced call of
    any tool made from a pydantic model with a nested one was a 400."""
    import jsonschema

    tools = [LOOKUP, {"name": "get_time", "parameters": {"type": "object", "properties": {}}}]
    sampling = SamplingParams(temperature=0.0, grammar=tool_grammar(tools, choice, False))
    run = drive(engine, [Run(0, chat(engine, "Where does Ada live? Look her up."), sampling, 80, stop_on_eog=True)])[0]
    text = text_of(engine, run.output)
    call = json.loads(text.removeprefix("<tool_call>\n").split("\n</tool_call>")[0])
    if call["name"] == "lookup":
        jsonschema.validate(call["arguments"], LOOKUP["parameters"])
    assert call["name"] == "lookup" or choice == "required", call


# -- tool_choice auto: free text, and a call the model begins held to the tools (llama-server's
# lazy grammar, scheduler.engines.grammar.lazy_tool_grammar). SmolLM2 never begins a call by
# itself; a bias on "<" makes it open one, and left free it then wrote "<tool_call>\n<name>
# <function-name><function-name>..." to max_tokens: the agent got markup as content.

WEATHER = {
    "name": "get_weather",
    "description": "Weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}


def _auto_request(engine: Any, bias: float, **extra: Any) -> dict[str, Any]:
    less_than = engine.tokenize("<", add_special=False, special=False)
    assert len(less_than) == 1
    return {
        "endpoint": "chat", "messages": [{"role": "user", "content": "What is the weather in Paris for 3 days?"}],
        "tools": [WEATHER], "tool_choice": "auto", "max_tokens": 100, "temperature": 0,
        "logit_bias": [[less_than[0], bias]] if bias else [], **extra,
    }  # fmt: skip


def _run_worker(engine: Any, request: dict[str, Any], tool_format: str | None = None, reasoning_format: str | None = None, **submit: Any) -> tuple[str, list[Message]]:
    """``request`` run alone on a worker to its end: (the text it streamed, its ending messages);
    ``submit`` the Submit's other fields (a resumed job's ``resume_text``); ``tool_format``,
    ``reasoning_format``: the call and reasoning formats the worker takes the model to write
    (else its template's)."""
    worker = EngineWorker(engine, SchedulerConfig(max_batch=N_LANES, lane_ctx=LANE_CTX), model_name="m")
    if tool_format is not None:
        worker.__dict__["tool_format"] = tool_format
    if reasoning_format is not None:
        worker.__dict__["reasoning_format"] = reasoning_format
    texts: list[str] = []
    ends: list[Message] = []

    class Conn:
        def queue(self, message: Message) -> None:
            if isinstance(message, Delta):
                texts.append(message.text)
            elif message.type in ("done", "error", "rejected"):
                ends.append(message)

    worker.handle(Conn(), Submit("auto", request, qos=2, **submit))  # type: ignore[arg-type]
    for _ in range(300):
        if ends:
            break
        worker.run_tick()
    return "".join(texts), ends


def _auto_job(engine: Any, request: dict[str, Any]) -> tuple[list[int], SamplingParams]:
    """The prompt and sampling a worker makes of ``request`` (the job cancelled unrun)."""
    worker = EngineWorker(engine, SchedulerConfig(max_batch=N_LANES, lane_ctx=LANE_CTX), model_name="m")

    class Conn:
        def queue(self, message: Message) -> None:
            pass

    worker.handle(Conn(), Submit("auto", request, qos=2))  # type: ignore[arg-type]
    job = worker.scheduler.jobs["auto"]
    worker.handle(Conn(), Cancel("auto"))  # type: ignore[arg-type]
    for _ in range(20):
        if not worker.run_tick() and worker.scheduler.idle:
            break
    return list(job.prompt), job.sampling


def test_tool_choice_auto_holds_a_call_the_model_begins_to_the_tools_parameters(engine: Any) -> None:
    import jsonschema

    from api.responses import parse_tool_calls

    text, ends = _run_worker(engine, _auto_request(engine, 8.0))
    assert [e.type for e in ends] == ["done"] and ends[0].finish_reason == "stop", (text, ends)  # type: ignore[attr-defined]
    content, calls = parse_tool_calls(text, ["get_weather"], fmt="hermes")
    assert calls and not content, text
    for call in calls:
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["parameters"])


@pytest.mark.parametrize(("fmt", "delivered"), [("llama3", '{"name": "'), ("mistral", "Sure. [TOOL_CALLS]")])
def test_tool_choice_auto_holds_a_call_opened_in_the_models_own_format(engine: Any, fmt: str, delivered: str) -> None:
    """Llama 3.x's and Mistral's own openings (grammar.lazy_tool_grammar): a reply resumed just
    after one (its grammar replays the delivered text) goes on as a call of the offered tool with
    arguments that fit, which the reader of that format takes, on the engine's own grammar
    sampler. (SmolLM2 stands in for those models: the worker is told their format.)"""
    import jsonschema

    from api.responses import parse_tool_calls

    text, ends = _run_worker(engine, _auto_request(engine, 0.0), tool_format=fmt, resume_text=delivered)
    assert [e.type for e in ends] == ["done"] and ends[0].finish_reason == "stop", (text, ends)  # type: ignore[attr-defined]
    _content, calls = parse_tool_calls(delivered + text, ["get_weather"], fmt=fmt)
    assert calls, delivered + text
    for call in calls:
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["parameters"])


def test_tool_choice_auto_holds_a_call_after_magistrals_reasoning_block_and_not_in_it(engine: Any) -> None:
    """Magistral's and Ministral 3 Reasoning's replies (reasoning format "mistral"): a
    [TOOL_CALLS] written while the model reasons is no call and is not held (the grammar replays
    it as free text), and one after [/THINK] goes on as a call of the offered tool that fits, on
    the engine's own grammar sampler. (SmolLM2 stands in for those models.)"""
    import jsonschema

    from api.reasoning import split_reasoning
    from api.responses import parse_tool_calls

    thought = 'I could write [TOOL_CALLS]get_weather[ARGS]{"town": 5} or <tool_call>{'
    delivered = f"[THINK]{thought}[/THINK]Sure. [TOOL_CALLS]"
    text, ends = _run_worker(engine, _auto_request(engine, 0.0), tool_format="mistral", reasoning_format="mistral", resume_text=delivered)
    assert [e.type for e in ends] == ["done"] and ends[0].finish_reason == "stop", (text, ends)  # type: ignore[attr-defined]
    reasoning, answer = split_reasoning(delivered + text, "mistral")
    assert reasoning == thought
    _content, calls = parse_tool_calls(answer, ["get_weather"], fmt="mistral")
    assert calls, delivered + text
    for call in calls:
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["parameters"])


@pytest.mark.parametrize("header", [" to=functions.", "<|channel|>commentary to=functions."], ids=["in-role", "in-channel"])
def test_tool_choice_auto_holds_a_gpt_oss_call_after_its_recipient_and_not_in_its_analysis(engine: Any, header: str) -> None:
    """gpt-oss's replies (reasoning format "harmony", tests/engines/test_lazy_tool_grammar_harmony_s52.py):
    a "to=functions." in its analysis is words, not held (the grammar replays it as free text),
    and a reply resumed just after a call's recipient opened, in the role's header or the
    channel's, goes on as a call of the offered tool with arguments that fit, which the reply's
    splitter reads, on the engine's own grammar sampler. (SmolLM2 stands in for gpt-oss: the
    harmony markers are text to it, as llama.cpp renders them.)"""
    import jsonschema

    from api.reasoning import split_reasoning
    from api.responses import parse_tool_calls

    thought = 'I could write to=functions.get_weather {"town": 5} or to=functions.search.'
    delivered = f"<|channel|>analysis<|message|>{thought}<|end|><|start|>assistant{header}"
    text, ends = _run_worker(engine, _auto_request(engine, 0.0), reasoning_format="harmony", resume_text=delivered)
    assert [e.type for e in ends] == ["done"] and ends[0].finish_reason == "stop", (text, ends)  # type: ignore[attr-defined]
    reasoning, answer = split_reasoning(delivered + text, "harmony", calls=["get_weather"])
    assert reasoning == thought
    _content, calls = parse_tool_calls(answer, ["get_weather"], fmt="hermes")
    assert [call["function"]["name"] for call in calls] == ["get_weather"], delivered + text
    jsonschema.validate(json.loads(calls[0]["function"]["arguments"]), WEATHER["parameters"])


def test_tool_choice_auto_leaves_the_text_before_a_call_free(engine: Any, prompts: list[list[int]], reference: list[list[int]]) -> None:
    """The grammar holds nothing until a call opens: a reply in words is the one the model
    gives free, token for token (here beside a free lane, in one batch)."""
    _, sampling = _auto_job(engine, _auto_request(engine, 0.0))
    assert sampling.grammar and engine.check_grammar(sampling.grammar) is None
    from scheduler.engines.grammar import lazy_tool_grammar

    coder = lazy_tool_grammar([{"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}], True, fmt="qwen3_coder")
    assert coder and "<function=f>" in coder and engine.check_grammar(coder) is None  # (Qwen3-Coder's own format)
    held, free = drive(engine, [Run(0, prompts[0], sampling, N_TOKENS), Run(1, prompts[1], GREEDY, N_TOKENS)])
    assert held.output == reference[0] and free.output == reference[1]


def test_a_call_held_in_tool_choice_auto_continues_exactly_across_parking(engine: Any) -> None:
    """Parked inside the call (its opening read, its arguments begun) and bound in another lane,
    the lane replays its history into the grammar: the call goes on as if never parked."""
    prompt, sampling = _auto_job(engine, _auto_request(engine, 8.0, parallel_tool_calls=False))  # (one call: fewer tokens)
    whole = drive(engine, [Run(0, prompt, sampling, 60, stop_on_eog=True)])[0]
    assert text_of(engine, whole.output).startswith('<tool_call>\n{"name": "get_weather"'), text_of(engine, whole.output)
    release(engine, 0)
    run = Run(0, prompt, sampling, 60, stop_on_eog=True)
    drive(engine, [run], ticks=14)
    assert "<tool_call>\n{" in text_of(engine, run.output) and not run.done
    parked = engine.execute(TickPlan(tick=15, park=[(0, "a")]), never).parked["a"]
    run.lane, run.bound = 2, True
    plan = TickPlan(tick=16, restore=[LaneRestore(2, "a", parked)], bind=[LaneBind(2, run.job, sampling, list(run.output))], feeds=[run.feed()])
    run.commit(engine.execute(plan, never))
    drive(engine, [run])
    release(engine, 2)
    assert run.output == whole.output


def test_a_history_the_grammar_rejects_is_bound_without_ending_the_process(engine: Any) -> None:
    """A resumed job replays its delivered text into its grammar; text the grammar rejects (a
    vocabulary that adds a leading space when it is tokenised again) made llama.cpp throw from
    C++ and the worker process abort, every lane lost. The lane is bound and still samples."""
    history = engine.tokenize("hello", add_special=False, special=False)
    sampling = SamplingParams(temperature=0.0, grammar='root ::= "{" [a-z]* "}"')
    run = drive(engine, [Run(0, chat(engine, "Say something."), sampling, len(history) + 6, output=list(history))])[0]
    assert len(run.output) > len(history)


@pytest.mark.parametrize(("delivered", "rest"), [("hello", r"\{[a-z]*\}"), ("{ab!", r"[a-z]*\}")], ids=["at-once", "midway"])
def test_a_history_the_grammar_rejects_leaves_it_constrained_from_the_last_token_it_accepted(
    engine: Any, delivered: str, rest: str
) -> None:
    """Both engines replay a resumed job's history into its grammar up to the first token the
    grammar rejects and go on constrained from there. MLX's matcher took the rejected token
    into its error state, which allows nothing but end-of-generation: the resumed reply ended
    at once, empty, where llama.cpp's went on inside the grammar."""
    history = engine.tokenize(delivered, add_special=False, special=False)
    sampling = SamplingParams(temperature=0.0, grammar='root ::= "{" [a-z]* "}"')
    prompt = chat(engine, "Say something.")
    run = drive(engine, [Run(0, prompt, sampling, len(history) + 8, stop_on_eog=True, output=list(history))])[0]
    assert run.done and re.fullmatch(rest, text_of(engine, run.output[len(history) :])), text_of(engine, run.output)


def test_a_special_token_is_its_text_to_a_grammar_that_writes_it(engine: Any) -> None:
    """llama.cpp's grammar reads every token as its text, control tokens included; llguidance
    reads a special token as none, so on MLX a grammar writing ``<|im_start|>`` allowed it only
    spelled in pieces (as Qwen's ``<tool_call>``: tests/engines/test_token_mask_specials_s51.py).
    Both engines now take the token itself where the grammar writes its text."""
    special = engine.tokenize("<|im_start|>", add_special=False, special=True)
    assert len(special) == 1
    sampling = SamplingParams(temperature=0.0, grammar='root ::= "<|im_start|>" "ok"', logit_bias=((special[0], 30.0),))
    run = drive(engine, [Run(0, chat(engine, "Say ok."), sampling, 12, stop_on_eog=True)])[0]
    release(engine, 0)
    assert run.output[0] == special[0] and run.done, run.output
    assert text_of(engine, run.output[1:]) == "ok"


def test_a_grammar_that_does_not_parse_is_named_by_check_grammar(engine: Any) -> None:
    assert engine.check_grammar('root ::= "x" missing')


# the model would not write this by itself: most of its tokens are a first pick the grammar rejects
ODD_GRAMMAR = 'root ::= "Zq" [0-9] [0-9] "|" ("ab" | "cd") ("ab" | "cd") ("ab" | "cd") "!"'


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.0, grammar=ODD_GRAMMAR),
        SamplingParams(temperature=0.9, seed=5, top_k=40, top_p=0.9, repeat_penalty=1.3, logit_bias=((28, -100.0),), grammar=ODD_GRAMMAR),
    ],
    ids=["greedy", "sampled-with-penalties-and-a-ban"],
)
def test_a_grammar_against_the_models_own_choice_is_followed_to_its_end(engine: Any, sampling: SamplingParams) -> None:
    run = drive(engine, [Run(0, chat(engine, "What is the capital of France?"), sampling, 40, stop_on_eog=True)])[0]
    release(engine, 0)
    assert re.fullmatch(r"Zq[0-9]{2}\|(ab|cd){3}!", text_of(engine, run.output)), text_of(engine, run.output)
    assert run.done and len(run.output) < 40  # the grammar's end left only end-of-generation


def test_llama_cpp_samples_first_and_masks_only_a_rejected_pick_with_the_same_greedy_reply(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp's constrained lanes check only the chain's pick against the grammar (the whole
    vocabulary is masked only when it is rejected); greedy replies must be those of masking first."""
    from scheduler.engines.llama_cpp import LlamaCppEngine

    if not isinstance(engine, LlamaCppEngine):
        pytest.skip("MLX masks with llguidance before sampling")
    question = chat(engine, "Describe a person as JSON.")
    grammar = SamplingParams(temperature=0.0, grammar=schema_grammar(SMALL_PERSON))
    checks: list[bool] = []
    drive(engine, [Run(1, question, grammar, 1)])  # binds a grammar: the candidate array exists
    release(engine, 1)
    cand = engine._candidates
    allows = cand.allows
    monkeypatch.setattr(cand, "allows", lambda g, t: checks.append(allows(g, t)) or checks[-1])
    sample_first = drive(engine, [Run(0, question, grammar, 30, stop_on_eog=True)])[0]
    release(engine, 0)
    # most picks passed the one-token check; some were rejected and masked
    assert checks.count(True) > len(checks) / 2 and len(checks) == len(sample_first.output) + 1
    masks: list[int] = []

    def mask_first(chain: Any, grammar_sampler: Any, index: int, _lane: int, _shared: bool) -> int:
        import llama_cpp

        masks.append(index)
        token = cand.pick_masked(llama_cpp.llama_get_logits_ith(engine._ctx, index), grammar_sampler, chain)
        llama_cpp.llama_sampler_accept(grammar_sampler, token)
        llama_cpp.llama_sampler_accept(chain, token)
        return token

    monkeypatch.setattr(engine, "_sample_constrained", mask_first)
    masked = drive(engine, [Run(0, question, grammar, 30, stop_on_eog=True)])[0]
    release(engine, 0)
    assert masks and sample_first.output == masked.output


# -- prefix cache operations ----------------------------------------------------------------


def _continue_greedy(engine: Any, lane: int, prompt: list[int], start: int, n: int = N_TOKENS) -> list[int]:
    run = Run(lane, prompt, max_tokens=n, computed=start)
    return drive(engine, [run])[0].output


def test_a_prefix_copied_from_another_lane_continues_like_a_full_prefill(
    engine: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    generate(engine, 0, prompts[0], max_tokens=2)
    shared = len(prompts[0]) - 9
    engine.execute(TickPlan(tick=0, pool=PoolOps(copy=[(0, 1, shared)])), never)
    assert _continue_greedy(engine, 1, prompts[0], shared) == reference[0]


def test_a_kept_lane_trimmed_to_the_prefix_a_new_prompt_shares_continues_like_a_full_prefill(
    engine: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    """A finished job's lane keeps its KV (its sampler goes); the next job sharing the start of
    its prompt is trimmed to that start and feeds the rest: the reply of a full prefill."""
    generate(engine, 0, prompts[1], max_tokens=3)
    shared = common_prefix(prompts[0], prompts[1])
    assert 8 < shared < len(prompts[0])
    engine.execute(TickPlan(tick=0, keep=[0]), never)
    assert not engine.bound_lanes()
    engine.execute(TickPlan(tick=0, trim=[(0, shared)]), never)
    assert _continue_greedy(engine, 0, prompts[0], shared) == reference[0]


def test_the_same_prompt_again_on_its_kept_lane_feeds_its_last_token_alone_and_replies_alike(
    engine: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    """A prompt sent again (a retry, a regenerate): the lane that answered it kept all of it, is
    trimmed to all but its last token, and feeds that token alone to sample from: the reply
    of a full prefill."""
    generate(engine, 0, prompts[0], max_tokens=3)
    engine.execute(TickPlan(tick=0, keep=[0]), never)
    whole = len(prompts[0]) - 1
    engine.execute(TickPlan(tick=0, trim=[(0, whole)]), never)
    assert _continue_greedy(engine, 0, prompts[0], whole) == reference[0]


def test_a_prefix_stored_evicted_to_host_and_imported_back_is_the_same_prefix(
    engine: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    generate(engine, 0, prompts[0], max_tokens=2)
    shared = len(prompts[0]) - 9
    engine.execute(TickPlan(tick=0, pool=PoolOps(store=[(0, SLOT0, shared)])), never)
    evicted = engine.execute(TickPlan(tick=0, release=[0], pool=PoolOps(evict=[(SLOT0, 7)])), never).evicted
    artifact = evicted[7]
    assert artifact.nbytes > 0 and artifact.n_tokens == shared
    engine.execute(TickPlan(tick=0, pool=PoolOps(imports=[(SLOT0 + 1, artifact)], copy=[(SLOT0 + 1, 1, shared)])), never)
    assert _continue_greedy(engine, 1, prompts[0], shared) == reference[0]


def test_a_shorter_share_of_a_longer_cached_prefix_keeps_only_the_shared_tokens(
    engine: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    generate(engine, 0, prompts[0], max_tokens=2)
    engine.execute(TickPlan(tick=0, pool=PoolOps(store=[(0, SLOT0, len(prompts[0]))])), never)
    shared = len(prompts[0]) // 2
    engine.execute(TickPlan(tick=0, pool=PoolOps(copy=[(SLOT0, 1, shared)])), never)
    assert _continue_greedy(engine, 1, prompts[0], shared) == reference[0]


def test_close_is_idempotent_and_final(engine: Any, request: pytest.FixtureRequest) -> None:
    maker = {"llamacpp": _llamacpp, "mlx": _mlx}[engine.name]
    other = maker(request)
    assert other.tokenize("Hi")
    other.close()
    other.close()
    with pytest.raises(EngineError):
        other.tokenize("Hi")
    with pytest.raises(EngineError):
        other.execute(TickPlan(tick=1), never)


# -- what only llama.cpp does -----------------------------------------------------------------


@pytest.fixture
def llamacpp(engine: Any) -> Any:
    if engine.name != "llamacpp":
        pytest.skip("prompt scoring and KV state bytes are llama.cpp's alone")
    return engine


def test_a_plain_greedy_lane_picks_what_llama_cpps_greedy_sampler_picks(llamacpp: Any, prompts: list[list[int]]) -> None:
    """A plain greedy lane takes the argmax of its logits row without llama.cpp's sampler; a
    greedy lane with a (neutral) logit bias goes through the sampler chain. Batched together
    on the same prompts they must pick the same tokens."""
    chained = SamplingParams(temperature=0.0, logit_bias=((0, 0.0),))
    for prompt in prompts:
        runs = [Run(0, prompt, GREEDY, 16), Run(1, prompt, chained, 16)]
        drive(llamacpp, runs, ticks=1)
        assert 0 in llamacpp._argmax_lanes and 1 not in llamacpp._argmax_lanes
        drive(llamacpp, runs)
        assert runs[0].output == runs[1].output
        release(llamacpp, 0, 1)
    assert not llamacpp._argmax_lanes


def test_restoring_garbage_state_bytes_loses_that_lane_only(llamacpp: Any) -> None:
    from scheduler.engines.llama_cpp import ParkedKV

    garbage = ParkedKV(b"\x00" * 64, 3)
    with pytest.raises(EngineError):
        llamacpp.load(1, garbage)
    result = llamacpp.execute(TickPlan(tick=1, restore=[LaneRestore(1, "x", garbage)]), never)
    assert result.lost == {1}


def test_scoring_a_greedy_continuation_finds_each_token_the_likeliest(
    llamacpp: Any, prompts: list[list[int]], reference: list[list[int]]
) -> None:
    tokens = prompts[0] + reference[0]
    scored = llamacpp.score_prompt(tokens, 2)
    assert len(scored) == len(tokens) - 1
    assert all(lp <= 0 and len(alts) == 2 for lp, alts in scored)
    for i, token in enumerate(reference[0]):  # greedy: each was the argmax where it was drawn
        lp, alts = scored[len(prompts[0]) - 1 + i]
        assert alts[0][0] == token and lp == pytest.approx(alts[0][1])


def test_scoring_a_prompt_longer_than_one_batch_sees_all_of_it(llamacpp: Any) -> None:
    sentence = llamacpp.tokenize("The quick brown fox jumps over the lazy dog. ", add_special=False)
    tokens = sentence * (700 // len(sentence) + 1)  # more than the 512-token chunk
    scored = llamacpp.score_prompt(tokens, 0)
    assert len(scored) == len(tokens) - 1
    first = sum(lp for lp, _ in scored[: len(sentence) - 1])
    late = sum(lp for lp, _ in scored[-(len(sentence) - 1):])
    assert late > first / 4  # by the last repetition (past the chunk) the model has seen it many times


def test_the_thread_count_changes_between_steps_and_the_greedy_reply_stays_the_same(
    llamacpp: Any, prompts: list[list[int]], reference: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread governor may change llama.cpp's threads at any step (busy cores): every step
    here alternates between all threads and one, and the replies are the ones of a fixed count."""
    if llamacpp.n_threads < 2:
        pytest.skip("one core: a single thread, nothing to change")
    governor = llamacpp.threads
    assert governor is not None and governor.max_threads == llamacpp.n_threads
    used: list[int] = []

    def alternate(kind: str) -> int:
        used.append(llamacpp.n_threads if len(used) % 2 else 1)
        return used[-1]

    monkeypatch.setattr(governor, "threads_for", alternate)
    for i in (0, 1):
        assert generate(llamacpp, 0, prompts[i], max_tokens=N_TOKENS) == reference[i]
        release(llamacpp, 0)
    assert set(used) == {1, llamacpp.n_threads}

# -- abortable steps (llama.cpp): a step carrying prompt tokens stops when ``abort_step()`` is set
# and llama.cpp rolls it back, so the lane is as it was before the step and running the step again
# gives what an undisturbed engine gives; decode-only steps are never aborted. Through the worker:
# an interactive chat arriving during a full-chunk prefill call aborts it and is answered next.


@pytest.fixture
def abortable(llamacpp: Any) -> Iterator[Any]:
    llamacpp.clear_abort()
    yield llamacpp
    llamacpp.clear_abort()


def cells(engine: Any, lane: int) -> int:
    return int(llama_cpp.llama_memory_seq_pos_max(engine._mem, lane)) + 1


def test_an_aborted_prefill_step_is_rolled_back_and_runs_again_as_if_never_started(abortable: Any) -> None:
    assert abortable.abortable
    story = chat(abortable, "Tell me a long story about a dragon who learns to bake bread. " * 3)
    reference = generate(abortable, 1, story, max_tokens=12)
    release(abortable, 1)
    # lane 0 holds a conversation in the middle of its reply while lane 1's prompt arrives
    other = chat(abortable, "What is the capital of France?")
    before = generate(abortable, 0, other, max_tokens=4)
    lane0 = cells(abortable, 0)

    plan = TickPlan(tick=0, step_tokens=512)
    plan.bind.append(LaneBind(lane=1, job_id="story", sampling=GREEDY))
    plan.feeds.append(LaneFeed(lane=1, job_id="story", start_pos=0, tokens=story, sample=True))
    abortable.abort_step()
    result = abortable.execute(plan, never)
    assert result.stopped_early and result.fed == {} and result.sampled == {}
    assert cells(abortable, 1) == 0  # nothing of the step is left in lane 1's KV
    assert cells(abortable, 0) == lane0  # and lane 0 lost nothing

    abortable.clear_abort()
    release(abortable, 1)
    assert generate(abortable, 1, story, max_tokens=12) == reference
    # lane 0 goes on where it was
    assert len(before) == 4 and cells(abortable, 0) == lane0


def test_a_decode_only_step_is_never_aborted(abortable: Any) -> None:
    prompt = chat(abortable, "List three prime numbers.")
    first = generate(abortable, 0, prompt, max_tokens=1)
    abortable.abort_step()
    plan = TickPlan(tick=1)
    plan.feeds.append(LaneFeed(lane=0, job_id="run0", start_pos=len(prompt), tokens=first, sample=True, decode=True))
    result = abortable.execute(plan, never)
    assert not result.stopped_early and result.fed == {0: 1} and 0 in result.sampled


def test_an_abort_naming_a_prompt_step_stops_that_step_alone_whose_end_the_engine_estimates(abortable: Any) -> None:
    """What an urgent arrival's grace stands on (docs/scheduling.md): during a prompt step the
    engine says which step runs and when it should end (at the measured rate); an abort naming
    that step stops it, one naming another step (ended, or not begun) stops nothing."""
    story = chat(abortable, "Tell me a long story about a dragon who learns to bake bread. " * 3)

    def step(abort: Callable[[tuple[int, float]], int | None]) -> tuple[TickResult, tuple[int, float]]:
        seen: list[tuple[int, float]] = []

        def watch() -> None:  # as the worker does from the link's reader thread
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not seen:
                eta = abortable.step_eta()
                if eta is not None:
                    seen.append(eta)
                    abortable.abort_step(serial=abort(eta))
                time.sleep(0.001)

        plan = TickPlan(tick=0, step_tokens=512)
        plan.bind.append(LaneBind(lane=1, job_id="story", sampling=GREEDY))
        plan.feeds.append(LaneFeed(lane=1, job_id="story", start_pos=0, tokens=story, sample=True))
        watcher = threading.Thread(target=watch)
        watcher.start()
        result = abortable.execute(plan, never)
        watcher.join()
        release(abortable, 1)
        abortable.clear_abort()
        return result, seen[0] if seen else (0, 0.0)

    generate(abortable, 1, story, max_tokens=1)  # a prompt step: the rate is measured
    release(abortable, 1)
    assert abortable.step_eta() is None  # no step runs
    result, (serial, eta) = step(lambda eta: eta[0] - 1)  # an earlier step's serial
    assert not result.stopped_early and 1 in result.sampled
    assert 0 < eta < 30  # seconds still to go, from the measured rate
    result, (later, _) = step(lambda eta: eta[0])
    assert later > serial and result.stopped_early and result.fed == {} and cells(abortable, 1) == 0
    abortable.abort_step(serial=later)  # that step has ended: the next one runs whole
    result, _ = step(lambda eta: eta[0] + 1)  # a later step's serial
    assert not result.stopped_early and 1 in result.sampled


class CountingAbort:
    """llama.cpp's abort callback replaced by one that stops the step at its ``limit``-th graph
    node (of the main compute thread), counting them in ``n``: an abort at a chosen point of a
    step, where the flag set from another thread would land anywhere."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.n, self.limit = engine, 0, 1 << 30

        @llama_cpp.ggml_abort_callback
        def counting(_data: object) -> bool:
            self.n += 1
            return self.n >= self.limit

        self._fn = counting

    def arm(self, limit: int) -> None:
        self.n, self.limit = 0, limit

    def __enter__(self) -> CountingAbort:
        self._original = self.engine._abort_fn
        self.engine._abort_fn, self.engine._abort_watching = self._fn, False  # watched by the next prefill step
        return self

    def __exit__(self, *exc: object) -> None:
        engine = self.engine
        engine._abort_fn, engine._abort_watching = self._original, False
        llama_cpp.llama_set_abort_callback(engine._ctx, engine._abort_fn, ctypes.addressof(engine._no_abort))


def test_an_abort_in_a_later_ubatch_of_a_mixed_step_keeps_nothing_of_the_step(abortable: Any) -> None:
    # A decode token beside a prompt chunk is split by llama.cpp into two ubatches; an abort in
    # the second rolls back only that one. The engine must trim the first one's cells too (a
    # fuzz run found the next prefill of that lane failing on positions otherwise).
    story = chat(abortable, "Tell me a long story about a dragon who learns to bake bread. " * 2)
    held = generate(abortable, 0, story[:20], max_tokens=1)  # lane 0: 20 prompt tokens, one sampled

    def mixed_step() -> TickResult:
        plan = TickPlan(tick=0, step_tokens=512)
        plan.bind.append(LaneBind(lane=1, job_id="story", sampling=GREEDY))
        plan.feeds.append(LaneFeed(lane=0, job_id="run0", start_pos=20, tokens=held, sample=True, decode=True))
        plan.feeds.append(LaneFeed(lane=1, job_id="story", start_pos=0, tokens=story, sample=True))
        return abortable.execute(plan, never)

    with CountingAbort(abortable) as calls:
        whole = mixed_step()
        nodes = calls.n
        assert not whole.stopped_early and cells(abortable, 0) == 21 and cells(abortable, 1) == len(story)
        llama_cpp.llama_memory_seq_rm(abortable._mem, 0, 20, -1)
        release(abortable, 1)
        calls.arm(nodes * 3 // 4)  # inside the second of the two ubatches
        result = mixed_step()
    assert result.stopped_early and result.fed == {} and result.sampled == {}
    assert cells(abortable, 0) == 20 and cells(abortable, 1) == 0


def test_an_interactive_chat_arriving_during_a_big_prefill_step_aborts_it_and_goes_next(abortable: Any) -> None:
    """The worker end to end on the real engine, prompts prepared on their own thread as in the
    server: a background agent decodes while another's ~900-token prompt prefills beside it in
    full chunks (one llama_decode of the decode token and ~511 prompt tokens, about 2 s here).
    An interactive chat, delivered as the link's reader thread delivers it while such a call
    runs, aborts the call: no full chunk runs before the chat's first token, and the aborted
    chunk is prefilled again later, so the agents finish as they do undisturbed."""
    story = "Tell me a long story about a dragon who learns to bake bread in a small village. " * 50

    def run(with_chat: bool) -> tuple[list[str], dict[str, str], dict[str, dict[str, int]]]:
        worker = EngineWorker(
            abortable, SchedulerConfig(max_batch=2, lane_ctx=1024), model_name="m", prepare_in_thread=True
        )
        events: list[str] = []  # what the engine and the client saw, in order
        texts: dict[str, str] = {}
        usage: dict[str, dict[str, int]] = {}

        class Conn:
            def queue(self, message: Message) -> None:
                if isinstance(message, Delta):
                    if message.id not in texts:
                        events.append(f"first token {message.id}")
                    texts[message.id] = texts.get(message.id, "") + message.text
                elif isinstance(message, Done):
                    usage[message.id] = message.usage

        conn = Conn()

        def deliver(message: Submit) -> None:  # as LinkServer's reader thread does
            worker._on_message(message)
            worker.inbox.put((conn, message))  # type: ignore[arg-type]

        def body(prompt: str, n: int) -> dict[str, object]:
            return {"endpoint": "completions", "prompt": prompt, "max_tokens": n, "temperature": 0}

        forward = abortable.forward
        sent: list[bool] = []

        def watched(step: Step) -> dict[int, int]:
            n_prompt = sum(len(p.tokens) for p in step.pieces) if step.prefill else 0
            if with_chat and not sent and n_prompt >= 500:
                sent.append(True)
                chat = Submit("chat", body("Say hello.", 4), qos=0)
                threading.Timer(0.01, deliver, args=(chat,)).start()  # while this call runs
            try:
                out = forward(step)
            except StepAborted:
                events.append(f"aborted {n_prompt}")
                raise
            events.append(f"step {n_prompt}")
            return out

        abortable.forward = watched  # type: ignore[method-assign]
        try:
            deliver(Submit("talker", body("Here is a list of fruits and their colours:\n1.", 24), qos=3))
            deliver(Submit("long", body(story, 6), qos=3))
            want = {"talker", "long", "chat"} if with_chat else {"talker", "long"}
            deadline = time.monotonic() + 300
            while set(usage) < want and time.monotonic() < deadline:
                worker.interrupt.clear()
                abortable.clear_abort()
                worker._drain_inbox(0.05 if worker.preparing or not worker.scheduler.jobs else 0.0)
                worker.run_tick()
        finally:
            del abortable.forward
            # the finished jobs' lanes keep their KV for a next job of this worker's scheduler;
            # the next run's worker is another scheduler on the same engine: empty them
            abortable.execute(TickPlan(tick=0, release=list(range(abortable.n_lanes))), lambda: False)
        return events, texts, usage

    events, texts, usage = run(with_chat=True)
    _, quiet_texts, quiet_usage = run(with_chat=False)
    aborted = [i for i, e in enumerate(events) if e.startswith("aborted") and int(e.split()[1]) >= 500]
    assert aborted, events  # the big call in flight was stopped
    chat_first = events.index("first token chat")
    full_steps = [e for e in events[aborted[0] : chat_first] if e.startswith("step") and int(e.split()[1]) >= 500]
    assert full_steps == [], events  # the chat did not wait for a full chunk
    assert usage["chat"]["completion_tokens"] == 4
    assert {k: v for k, v in texts.items() if k != "chat"} == quiet_texts
    assert {k: v for k, v in usage.items() if k != "chat"} == quiet_usage


def test_a_constrained_job_resumed_after_its_worker_was_lost_goes_on_inside_the_same_json(engine: Any) -> None:
    """A job resubmitted with the text its client already got (a lost worker) continues that
    text under its grammar: what the client ends up with, the delivered part and the rest, is
    one JSON object. The grammar used to start again from its root, so the rest was a whole
    new value after the delivered half."""
    delivered = '{"name": "Ada", "age'
    request = {"endpoint": "completions", "prompt": "A person as JSON:", "max_tokens": 40, "temperature": 0, "response_format": {"type": "json_object"}}
    text, done = _run_worker(engine, request, resume_text=delivered, resume_tokens=6)
    assert done and isinstance(done[0], Done) and done[0].finish_reason == "stop", (done, text)
    whole = delivered + text
    assert isinstance(json.loads(whole), dict) and json.loads(whole)["name"] == "Ada", whole


def test_a_fim_prompt_is_bos_then_the_fim_tokens_around_the_clients_text_read_as_text(
    engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fill-in-the-middle as llama.cpp's server assembles it: [BOS] when the vocabulary asks for
    one, FIM prefix, the prefix, FIM suffix, the suffix, FIM middle. Prefix and suffix are code
    and tokenised as text: a file mentioning a control token's text (here SmolLM2's, standing in
    for its FIM tokens) got that control token in the middle of the prompt, and no BOS came."""
    pre, suf, mid = engine.tokenize("<|im_start|><|im_end|><|endoftext|>", add_special=False)
    monkeypatch.setattr(engine, "fim_tokens", lambda: (pre, suf, mid))
    monkeypatch.setattr(engine, "_add_bos", True)
    worker = EngineWorker(engine, SchedulerConfig(max_batch=N_LANES, lane_ctx=LANE_CTX), model_name="m")
    sent: list[Message] = []

    class Conn:
        def queue(self, message: Message) -> None:
            sent.append(message)

    prefix, suffix = 'END = "<|im_end|>"\ndef f(', '):\n    return "<|endoftext|>"\n'
    request = {"endpoint": "completions", "prompt": prefix, "suffix": suffix, "max_tokens": 2, "temperature": 0}
    worker.handle(Conn(), Submit("fim", request, qos=2))  # type: ignore[arg-type]
    prompt = worker.scheduler.jobs["fim"].prompt
    as_text = [engine.tokenize(t, add_special=False, special=False) for t in (prefix, suffix)]
    assert prompt == [engine.bos_id, pre, *as_text[0], suf, *as_text[1], mid], sent
    worker.handle(Conn(), Cancel("fim"))  # type: ignore[arg-type]
    for _ in range(20):
        if not worker.run_tick() and worker.scheduler.idle:
            break


def test_lanes_fed_in_any_order_run_in_one_pass_over_the_weights(abortable: Any) -> None:
    """With a KV stream per sequence, llama.cpp puts only consecutive sequences in one ubatch,
    in the order the batch lists them: lanes 1 and 0 listed so took two passes over the model
    (twice the graph nodes) where 0 and 1 take one. A review helper measured 0,2,4,6,1,3,5,7
    at four passes. The engine lists a step's pieces in lane order."""
    prompts = {lane: chat(abortable, f"Count to {lane + 3}.") for lane in (0, 1)}

    def nodes(order: list[int]) -> int:
        for lane in (0, 1):
            release(abortable, lane)
        plan = TickPlan(tick=0, step_tokens=512)
        for lane in order:
            plan.bind.append(LaneBind(lane=lane, job_id=f"l{lane}", sampling=GREEDY))
            plan.feeds.append(LaneFeed(lane=lane, job_id=f"l{lane}", start_pos=0, tokens=prompts[lane], sample=True))
        with CountingAbort(abortable) as calls:
            assert not abortable.execute(plan, never).stopped_early
            return calls.n

    assert nodes([1, 0]) == nodes([0, 1])


def test_the_worker_moves_a_job_into_the_gap_a_finished_one_left_and_every_text_is_unchanged(abortable: Any) -> None:
    """llama.cpp with a KV stream per sequence asks for compact lanes: when the job in lane 1
    finishes, the job in lane 2 moves into it (its KV and its seeded sampler), so the decode
    rounds after that run lanes 0-1 in one pass over the weights instead of 0 and 2 in two; every
    reply is the one it gets with no move at all."""
    assert abortable.compact_lanes

    def serve(compact: bool) -> tuple[dict[str, str], list[list[int]], int]:
        release(abortable, *range(N_LANES))  # the last worker's kept lanes
        worker = EngineWorker(abortable, SchedulerConfig(max_batch=N_LANES, lane_ctx=LANE_CTX), model_name="m")
        worker.scheduler.config.compact_lanes = compact
        texts: dict[str, str] = {}
        done: set[str] = set()
        rounds: list[list[int]] = []

        class Conn:
            def queue(self, message: Message) -> None:
                if isinstance(message, Delta):
                    texts[message.id] = texts.get(message.id, "") + message.text
                elif isinstance(message, Done):
                    done.add(message.id)

        for name, n, seed in (("a", 30, None), ("b", 3, None), ("c", 30, 7)):
            body = {"endpoint": "completions", "prompt": f"Tell me about {name}pples.", "max_tokens": n, "ignore_eos": True}
            body |= {"temperature": 0.9, "seed": seed} if seed is not None else {"temperature": 0}
            worker.handle(Conn(), Submit(name, body, qos=2))  # type: ignore[arg-type]
        for _ in range(400):
            if len(done) == 3:
                break
            worker.run_tick()
            plan = worker.scheduler.last_plan
            if plan is not None and any(f.is_decode for f in plan.feeds):
                rounds.append(sorted(f.lane for f in plan.feeds if f.is_decode))
        assert len(done) == 3
        return texts, rounds, worker.scheduler.counters["lane_moves"]

    moved, rounds_moved, n_moves = serve(True)
    kept, rounds_kept, _ = serve(False)
    assert n_moves == 1 and moved == kept
    assert [0, 2] in rounds_kept and [0, 2] not in rounds_moved and rounds_moved[-1] == [0, 1]


def test_the_grammar_credit_refills_with_the_steps_decode_and_never_holds_more_than_the_grace(llamacpp: Any) -> None:
    """The guard's arithmetic, on the engine's own counters: masks as long as the steps' decode
    never run the credit out; a job that banked many cheap steps still cannot stall the others
    longer than the grace in one burst; a GPU's millisecond steps earn the floor, enough for a
    schema's masks at every token; masks steadily longer than the steps run it out."""
    from scheduler.engines import llama_cpp as engine_module

    lane = 2
    try:
        llamacpp._decode_s = 0.03
        for _ in range(500):
            llamacpp._charge_mask(lane, 0.029)
        for _ in range(500):
            llamacpp._charge_mask(lane, 0.0)  # cheap steps: the credit stays at the grace
        assert llamacpp.take_failed() == {}
        llamacpp._charge_mask(lane, engine_module.GRAMMAR_GRACE_S + 0.05)
        assert lane in llamacpp.take_failed()
        llamacpp.drop_sampler(lane)
        llamacpp._decode_s = 0.002
        for _ in range(2000):
            llamacpp._charge_mask(lane, engine_module.GRAMMAR_FLOOR_S)
        assert llamacpp.take_failed() == {}
        llamacpp._decode_s = 0.03
        tokens, failed = 0, {}
        while not failed and tokens < 400:
            llamacpp._charge_mask(lane, 0.06)  # 30 ms over each step: the 5 s last ~167 tokens
            tokens += 1
            failed = llamacpp.take_failed()
        assert lane in failed and 150 < tokens < 185
    finally:
        llamacpp.drop_sampler(lane)


def test_a_grammar_too_slow_to_mask_ends_its_job_alone_and_the_lane_beside_it_goes_on(abortable: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule of 1,000 alternatives costs llama.cpp 0.1-0.2 s a full mask here, and every lane
    of the step waits for it. A job's masks in steps it shares spend a credit (5 s; 0.05 s here,
    less than one such mask, to be quick) that those steps' own decode time refills; when it runs
    out the job ends with grammar_too_slow, and the greedy job beside it streams what it streams
    alone. (With 0.3 s the job's end hung on how fast the CPU masks: three masks went over it on
    one machine, and the job finished on another, its later masks cheaper.)"""
    from scheduler.engines import llama_cpp as engine_module
    from scheduler.link.messages import GRAMMAR_TOO_SLOW

    monkeypatch.setattr(engine_module, "GRAMMAR_GRACE_S", 0.05)
    slow = "root ::= item+\nitem ::= (" + " | ".join(f'"zq{i}w"' for i in range(1000)) + ') " "'

    def serve(with_slow: bool) -> tuple[dict[str, str], dict[str, Message]]:
        release(abortable, *range(N_LANES))
        worker = EngineWorker(abortable, SchedulerConfig(max_batch=N_LANES, lane_ctx=LANE_CTX), model_name="m")
        texts: dict[str, str] = {}
        ends: dict[str, Message] = {}

        class Conn:
            def queue(self, message: Message) -> None:
                if isinstance(message, Delta):
                    texts[message.id] = texts.get(message.id, "") + message.text
                elif isinstance(message, (Done, Error)):
                    ends[message.id] = message

        worker.handle(Conn(), Submit("free", {"endpoint": "completions", "prompt": "Tell me about apples.", "max_tokens": 24, "temperature": 0}, qos=2))  # type: ignore[arg-type]
        if with_slow:
            body = {"endpoint": "completions", "prompt": "Numbers:", "max_tokens": 40, "temperature": 0, "response_format": {"type": "grammar", "grammar": slow}}
            worker.handle(Conn(), Submit("slow", body, qos=2))  # type: ignore[arg-type]
        for _ in range(300):
            if len(ends) == (2 if with_slow else 1):
                break
            worker.run_tick()
        return texts, ends

    texts, ends = serve(True)
    alone, _ = serve(False)
    assert isinstance(ends["slow"], Error) and ends["slow"].reason == GRAMMAR_TOO_SLOW, ends
    assert "too many" in ends["slow"].detail
    assert isinstance(ends["free"], Done) and texts["free"] == alone["free"]
