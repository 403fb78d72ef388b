"""Abortable steps on the real llama.cpp engine (issue 13): a step carrying prompt tokens stops
when ``abort_step()`` is set and llama.cpp rolls it back, so the lane is as it was before the
step and running the step again gives what an undisturbed engine gives; decode-only steps are
never aborted. End to end through the worker: an interactive chat arriving during a full-chunk
prefill call aborts it and is answered next."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import llama_cpp
import pytest

from scheduler.core.scheduler import SchedulerConfig
from scheduler.core.types import LaneBind, LaneFeed, TickPlan, TickResult
from scheduler.engines.base import Step, StepAborted
from scheduler.engines.llama_cpp import LlamaCppEngine
from scheduler.engines.models import default_model_path
from scheduler.link.messages import Delta, Done, Message, Submit
from scheduler.worker.loop import EngineWorker
from testkit.engine_driver import GREEDY, chat, generate, never, release

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    eng = LlamaCppEngine(default_model_path(), n_lanes=2, lane_ctx=1024)
    yield eng
    eng.close()


@pytest.fixture(autouse=True)
def clean(engine: LlamaCppEngine) -> Iterator[None]:
    engine.clear_abort()
    yield
    engine.clear_abort()
    release(engine, 0, 1)


def cells(engine: LlamaCppEngine, lane: int) -> int:
    return int(llama_cpp.llama_memory_seq_pos_max(engine._mem, lane)) + 1


def test_an_aborted_prefill_step_is_rolled_back_and_runs_again_as_if_never_started(engine: LlamaCppEngine) -> None:
    assert engine.abortable
    story = chat(engine, "Tell me a long story about a dragon who learns to bake bread. " * 3)
    reference = generate(engine, 1, story, max_tokens=12)
    release(engine, 1)
    # lane 0 holds a conversation in the middle of its reply while lane 1's prompt arrives
    other = chat(engine, "What is the capital of France?")
    before = generate(engine, 0, other, max_tokens=4)
    lane0 = cells(engine, 0)

    plan = TickPlan(tick=0, step_tokens=512)
    plan.bind.append(LaneBind(lane=1, job_id="story", sampling=GREEDY))
    plan.feeds.append(LaneFeed(lane=1, job_id="story", start_pos=0, tokens=story, sample=True))
    engine.abort_step()
    result = engine.execute(plan, never)
    assert result.stopped_early and result.fed == {} and result.sampled == {}
    assert cells(engine, 1) == 0  # nothing of the step is left in lane 1's KV
    assert cells(engine, 0) == lane0  # and lane 0 lost nothing

    engine.clear_abort()
    release(engine, 1)
    assert generate(engine, 1, story, max_tokens=12) == reference
    # lane 0 goes on where it was
    assert len(before) == 4 and cells(engine, 0) == lane0


def test_a_decode_only_step_is_never_aborted(engine: LlamaCppEngine) -> None:
    prompt = chat(engine, "List three prime numbers.")
    first = generate(engine, 0, prompt, max_tokens=1)
    engine.abort_step()
    plan = TickPlan(tick=1)
    plan.feeds.append(LaneFeed(lane=0, job_id="run0", start_pos=len(prompt), tokens=first, sample=True, decode=True))
    result = engine.execute(plan, never)
    assert not result.stopped_early and result.fed == {0: 1} and 0 in result.sampled


def test_an_abort_in_a_later_ubatch_of_a_mixed_step_keeps_nothing_of_the_step(engine: LlamaCppEngine) -> None:
    # A decode token beside a prompt chunk is split by llama.cpp into two ubatches; an abort in
    # the second rolls back only that one. The engine must trim the first one's cells too (a
    # fuzz run found the next prefill of that lane failing on positions otherwise).
    calls = {"n": 0, "limit": 1 << 30}

    @llama_cpp.ggml_abort_callback
    def counting(_data: object) -> bool:  # aborts at the limit-th graph node
        calls["n"] += 1
        return calls["n"] >= calls["limit"]

    story = chat(engine, "Tell me a long story about a dragon who learns to bake bread. " * 2)
    held = generate(engine, 0, story[:20], max_tokens=1)  # lane 0: 20 prompt tokens, one sampled

    def mixed_step(limit: int) -> TickResult:
        calls["n"], calls["limit"] = 0, limit
        engine._abort_fn, engine._abort_watching = counting, False  # watched by the next prefill step
        plan = TickPlan(tick=0, step_tokens=512)
        plan.bind.append(LaneBind(lane=1, job_id="story", sampling=GREEDY))
        plan.feeds.append(LaneFeed(lane=0, job_id="run0", start_pos=20, tokens=held, sample=True, decode=True))
        plan.feeds.append(LaneFeed(lane=1, job_id="story", start_pos=0, tokens=story, sample=True))
        return engine.execute(plan, never)

    original = engine._abort_fn
    try:
        whole = mixed_step(1 << 30)
        nodes = calls["n"]
        assert not whole.stopped_early and cells(engine, 0) == 21 and cells(engine, 1) == len(story)
        llama_cpp.llama_memory_seq_rm(engine._mem, 0, 20, -1)
        release(engine, 1)
        result = mixed_step(nodes * 3 // 4)  # inside the second of the two ubatches
        assert result.stopped_early and result.fed == {} and result.sampled == {}
        assert cells(engine, 0) == 20 and cells(engine, 1) == 0
    finally:
        engine._abort_fn, engine._abort_watching = original, False


def test_an_interactive_chat_arriving_during_a_big_prefill_step_aborts_it_and_goes_next(engine: LlamaCppEngine) -> None:
    """The worker end to end on the real engine, prompts prepared on their own thread as in the
    server: a background agent decodes while another's ~900-token prompt prefills beside it in
    full chunks (one llama_decode of the decode token and ~511 prompt tokens, about 2 s here).
    An interactive chat, delivered as the link's reader thread delivers it while such a call
    runs, aborts the call: no full chunk runs before the chat's first token, and the aborted
    chunk is prefilled again later, so the agents finish as they do undisturbed."""
    story = "Tell me a long story about a dragon who learns to bake bread in a small village. " * 50

    def run(with_chat: bool) -> tuple[list[str], dict[str, str], dict[str, dict[str, int]]]:
        worker = EngineWorker(
            engine, SchedulerConfig(max_batch=2, lane_ctx=1024), model_name="m", prepare_in_thread=True
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

        forward = engine.forward
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

        engine.forward = watched  # type: ignore[method-assign]
        try:
            deliver(Submit("talker", body("Here is a list of fruits and their colours:\n1.", 24), qos=3))
            deliver(Submit("long", body(story, 6), qos=3))
            want = {"talker", "long", "chat"} if with_chat else {"talker", "long"}
            deadline = time.monotonic() + 300
            while set(usage) < want and time.monotonic() < deadline:
                worker.interrupt.clear()
                engine.clear_abort()
                worker._drain_inbox(0.05 if worker.preparing or not worker.scheduler.jobs else 0.0)
                worker.run_tick()
        finally:
            del engine.forward
            # the finished jobs' lanes keep their KV for a next job of this worker's scheduler;
            # the next run's worker is another scheduler on the same engine: empty them
            engine.execute(TickPlan(tick=0, release=list(range(engine.n_lanes))), lambda: False)
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
