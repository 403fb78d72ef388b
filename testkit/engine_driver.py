"""Drive any engine with hand-built TickPlans, playing the scheduler's part: bind, feed the
unfed part of prompt + output, commit what was fed and sampled."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scheduler.core.types import LaneBind, LaneFeed, SamplingParams, TickPlan, TickResult

GREEDY = SamplingParams(temperature=0.0)
# SmolLM2's own default system prompt makes the 135M model ramble in French about the capital
# of France; a plain one gets "The capital of France is Paris."
SYSTEM = "You are a helpful assistant."


def never() -> bool:
    return False


def release(engine: Any, *lanes: int) -> None:
    engine.execute(TickPlan(tick=0, release=list(lanes)), never)


def chat(engine: Any, question: str) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return list(engine.tokenize(engine.render_chat(messages)))


def text_of(engine: Any, tokens: list[int]) -> str:
    return b"".join(engine.token_bytes(t) for t in tokens).decode("utf-8", "replace")


@dataclass
class Run:
    """One generation, tracked the way the scheduler tracks a job."""

    lane: int
    prompt: list[int]
    sampling: SamplingParams = GREEDY
    max_tokens: int = 8
    stop_on_eog: bool = False  # off: outputs have a fixed length, so they compare exactly
    output: list[int] = field(default_factory=list)
    computed: int = 0  # tokens of prompt + output in the lane's KV cache
    bound: bool = False
    done: bool = False

    @property
    def job(self) -> str:
        return str(id(self))

    def feed(self, chunk: int = 1 << 20) -> LaneFeed:
        if self.computed < len(self.prompt):
            tokens = self.prompt[self.computed : self.computed + chunk]
            finishes = self.computed + len(tokens) == len(self.prompt)
            return LaneFeed(self.lane, self.job, self.computed, tokens, finishes)
        rest = (self.prompt + self.output)[self.computed :]
        return LaneFeed(self.lane, self.job, self.computed, rest, True, decode=len(rest) == 1)

    def commit(self, result: TickResult) -> None:
        self.computed += result.fed.get(self.lane, 0)
        if self.lane not in result.sampled:
            return
        if self.stop_on_eog and self.lane in result.eog:
            self.done = True
            return
        self.output.append(result.sampled[self.lane])
        self.done = len(self.output) >= self.max_tokens


def drive(
    engine: Any,
    runs: list[Run],
    *,
    chunk: int = 1 << 20,
    step_tokens: int = 512,
    ticks: int | None = None,
) -> list[Run]:
    """Tick until every run is done (or ``ticks`` ran): bind, then feed → sample → feed."""
    tick = 0
    while any(not r.done for r in runs) and (ticks is None or tick < ticks):
        tick += 1
        plan = TickPlan(tick=tick, step_tokens=step_tokens)
        live = [r for r in runs if not r.done]
        for r in live:
            if not r.bound:
                plan.bind.append(LaneBind(r.lane, r.job, r.sampling, list(r.output)))
                r.bound = True
            plan.feeds.append(r.feed(chunk))
        result = engine.execute(plan, never)
        for r in live:
            r.commit(result)
    return runs


def generate(
    engine: Any, lane: int, prompt: list[int], sampling: SamplingParams = GREEDY, max_tokens: int = 8
) -> list[int]:
    return drive(engine, [Run(lane, prompt, sampling, max_tokens)])[0].output
