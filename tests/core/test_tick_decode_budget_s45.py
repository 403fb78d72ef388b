"""--tick-decode-budget on an engine with multi-round ticks (llama.cpp, MLX): a tick ends at
the round its decode budget is spent (docs/scheduling.md#ticks), so the lanes never sit through
empty rounds waiting out the tick's target."""

from __future__ import annotations

from collections import Counter

from .builders import make_job, make_scheduler


def test_a_spent_decode_budget_ends_a_multi_round_tick_at_the_next_round() -> None:
    """Two lanes decoding, --tick-decode-budget 3, 20 ms rounds under the 250 ms busy target:
    each tick grants 2 tokens then 1, and the next round starts a new tick with a fresh budget.
    Were the tick to run on to its target, its later rounds would feed nothing (the budget is
    spent): ~10 empty rounds a tick, the streams at a fraction of their speed."""
    sched, engine, clock = make_scheduler(max_batch=2, tick_targets_s=(0.05, 0.25), decode_round_s=0.02, tick_decode_budget=3)
    for i in range(2):
        sched.add(make_job(job_id=f"s{i}", max_tokens=1000))
    sched.commit(engine.execute(sched.step(), lambda: False))  # the prompts: a tick of their own
    per_tick: Counter[int] = Counter()
    for _ in range(30):
        plan = sched.step()
        assert plan.decode_tokens > 0, f"round {sched.rounds} of tick {plan.tick} fed nothing"
        per_tick[plan.tick] += plan.decode_tokens
        sched.commit(engine.execute(plan, lambda: False))
    full = [n for t, n in sorted(per_tick.items())][:-1]  # the last tick may be cut off by the loop
    assert len(full) >= 9 and set(full) == {3}, per_tick
