"""What the engine calls of a prompt-bound workload are made of, and what each kind costs.

The workload of ``bench/scenarios.py --scenario shared-prefix``'s distinct half (32 chats whose
~810-token system prompts differ, 16 tokens each, all at once) goes through the in-process worker
(scheduler, real llama.cpp engine, text output; no HTTP), with every ``llama_decode`` call timed
and sorted by what it carried: prompt tokens only, prompt tokens and decode tokens (a prefill
step with the decoding lanes' round riding in it), or decode tokens only. The table shows, per
kind, the calls, their time, and the tokens of each sort; then how many runs of consecutive
lanes the calls held (each run is a pass over the weights: docs/scheduling.md, lane compaction)
and the compute threads each call ran with (a lane fed one token counts as decoding: a prompt's
last token alone in a call is rare). Whatever the worker spends outside the calls is the gap
between the wall time and the calls' time.

    python bench/step_profile.py [--slots 4] [--seed 1]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scenarios import (  # noqa: E402
    SHARED_MAX_TOKENS,
    SHARED_REQUESTS,
    SYSTEM_PROMPT_TOKENS,
    Tokens,
    shared_prefix_chats,
)
from bench.throughput import run_worker_inprocess  # noqa: E402
from scheduler.core.scheduler import lane_runs  # noqa: E402
from scheduler.engines.models import default_model_path  # noqa: E402


def distinct_requests(tokens: Tokens, seed: str) -> list[dict[str, Any]]:
    """The distinct-prompts workload as the chat requests the web process hands the worker: the
    worker renders them with the model's template, as for a served chat."""
    return [
        {
            "endpoint": "chat",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": SHARED_MAX_TOKENS,
            "temperature": 0.0,
        }
        for system, user in shared_prefix_chats(tokens, False, seed)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--slots", type=int, default=4, help="prefix-cache slots of the engine (serve's default: %(default)s)"
    )
    parser.add_argument("--lanes", type=int, default=8, help="lanes (serve's --max-batch; default: %(default)s)")
    parser.add_argument("--seed", default="1", help="seed of the prompts' text")
    args = parser.parse_args()

    from scheduler.engines.llama_cpp import LlamaCppEngine

    model = default_model_path()
    requests = distinct_requests(Tokens(model), args.seed)
    engine = LlamaCppEngine(model, n_lanes=args.lanes, cache_slots=args.slots)
    calls: list[tuple[int, int, int, float]] = []  # (decode tokens, prompt tokens, lane runs, seconds)
    threads: collections.Counter[tuple[int, str]] = collections.Counter()
    forward = engine.forward

    def timed_forward(step: Any) -> dict[int, int]:
        started = time.perf_counter()
        sampled = forward(step)
        seconds = time.perf_counter() - started
        runs = lane_runs([piece.lane for piece in step.pieces])
        decode = sum(1 for piece in step.pieces if len(piece.tokens) == 1)
        prompt = sum(len(piece.tokens) for piece in step.pieces if len(piece.tokens) > 1)
        calls.append((decode, prompt, runs, seconds))
        return sampled

    engine.forward = timed_forward  # type: ignore[method-assign]
    governor = engine.threads
    if governor is not None:
        threads_for = governor.threads_for

        def counted_threads_for(kind: str) -> int:
            n = threads_for(kind)
            threads[(n, kind.split("/")[0])] += 1
            return n

        governor.threads_for = counted_threads_for  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        result = run_worker_inprocess(engine, requests)
        wall = time.perf_counter() - started
    finally:
        engine.close()

    in_calls = sum(c[3] for c in calls)
    print(
        f"{SHARED_REQUESTS} distinct chats, ~{SYSTEM_PROMPT_TOKENS}-token system prompts, max_tokens {SHARED_MAX_TOKENS}, "
        f"{args.lanes} lanes, {args.slots} cache slots: wall {wall:.1f} s, in llama_decode {in_calls:.1f} s "
        f"({in_calls / wall:.1%}), {result['completion_tokens']} completion tokens"
    )
    print()
    print("| calls carrying | calls | seconds | decode tokens | prompt tokens | median call ms |")
    print("|---|--:|--:|--:|--:|--:|")
    kinds = {
        "prompt tokens only": lambda c: c[0] == 0,
        "prompt and decode tokens": lambda c: c[0] > 0 and c[1] > 0,
        "decode tokens only": lambda c: c[1] == 0,
    }
    for name, test in kinds.items():
        mine = [c for c in calls if test(c)]
        if mine:
            print(
                f"| {name} | {len(mine)} | {sum(c[3] for c in mine):.1f} | {sum(c[0] for c in mine)} | {sum(c[1] for c in mine)} "
                f"| {1000 * statistics.median(c[3] for c in mine):.1f} |"
            )
    print()
    runs = collections.Counter(c[2] for c in calls if c[0] > 0)
    print("runs of consecutive lanes per call with decode tokens:", dict(sorted(runs.items())))
    print("compute threads per call (threads, kind):", dict(sorted(threads.items())))


if __name__ == "__main__":
    main()
