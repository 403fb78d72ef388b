"""What the abort grace (``--abort-grace-ms``) buys and costs, on the real engine and worker.

Agents prefill ~1,000-token prompts in 512-token steps; an interactive chat arrives while the
third prompt step runs, ``R`` seconds before it is due to end (the step's length taken from the
step before it). With ``--abort-grace-ms 0`` the step is aborted at once and its work done
again; with the grace a step that has at most the grace left runs on and the chat's first token
waits for it. Each row is one run of the same work with the grace off, then on: the work thrown
away (seconds of aborted engine calls), the chat's time to first token, and the agents' total.

In process (no HTTP, no web process): the worker's own serving loop (``EngineWorker.run``) on
the real engine, prompts prepared on their own thread.

    python bench/abort_grace.py                  # R = 1.0, 0.5, 0.25, 0.1 s; grace 300 ms
    python bench/abort_grace.py --left 0.2 --agents 8 --grace-ms 300
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "superfluid_site.settings")

WORDS = (
    "the agent reads a file and writes a patch to fix the failing test then runs the build again "
    "while the log shows each step it took and what the compiler said about the change"
).split()


def one_run(engine: Any, agents: int, left_s: float, grace_s: float, seed: int) -> dict[str, float]:
    from scheduler.core.scheduler import SchedulerConfig
    from scheduler.core.types import TickPlan
    from scheduler.engines.base import StepAborted
    from scheduler.link.messages import Delta, Done, Message, Submit
    from scheduler.worker.loop import EngineWorker

    worker = EngineWorker(
        engine, SchedulerConfig(max_batch=engine.n_lanes, lane_ctx=engine.lane_ctx, abort_grace_s=grace_s, prefix_cache=False, cache_slots=0), model_name="m", prepare_in_thread=True
    )
    rng = random.Random(seed)
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    aborted: list[float] = []
    chat_at: list[float] = []
    into: list[float] = []  # how far into the step in flight the chat arrived
    current = [0.0]  # when the step in flight began

    class Conn:
        def queue(self, message: Message) -> None:
            if isinstance(message, Delta) and message.text:  # (an empty one says a preemption)
                first.setdefault(message.id, time.perf_counter())
            elif isinstance(message, Done):
                done[message.id] = time.perf_counter()

    conn = Conn()

    def deliver(message: Submit) -> None:  # as the link's reader thread does
        worker._on_message(message)
        worker.inbox.put((conn, message))  # type: ignore[arg-type]

    def chat() -> None:
        chat_at.append(time.perf_counter())
        into.append(chat_at[0] - current[0])
        body = {"endpoint": "completions", "prompt": "Q: What is the capital of France?\nA:", "max_tokens": 16, "temperature": 0}
        deliver(Submit("chat", body, qos=0))

    forward = engine.forward
    per_token: list[float] = []  # seconds a prompt token, in each full step so far

    def watched(step: Any) -> Any:
        started = current[0] = time.perf_counter()
        n = sum(len(p.tokens) for p in step.pieces)
        big = step.prefill and n >= 256
        if big and len(per_token) == 2 and not chat_at:  # the third: the chat lands R s before its end
            threading.Timer(max(0.0, n * per_token[-1] - left_s), chat).start()
        try:
            out = forward(step)
        except StepAborted:
            aborted.append(time.perf_counter() - started)
            raise
        if big:
            per_token.append((time.perf_counter() - started) / n)
        return out

    engine.forward = watched
    t0 = time.perf_counter()
    try:
        for i in range(agents):
            text = f"Agent {i}: " + " ".join(rng.choice(WORDS) for _ in range(950))
            deliver(Submit(f"a{i}", {"endpoint": "completions", "prompt": text, "max_tokens": 16, "temperature": 0, "ignore_eos": True}, qos=3))
        want = {f"a{i}" for i in range(agents)} | {"chat"}
        loop = threading.Thread(target=worker.run, daemon=True)  # the serving loop itself
        loop.start()
        while not want <= set(done) and time.perf_counter() - t0 < 900:
            time.sleep(0.01)
        worker.drain()
        loop.join(60)
    finally:
        del engine.forward
        engine.execute(TickPlan(tick=0, release=list(range(engine.n_lanes))), lambda: False)
    return {
        "thrown_s": sum(aborted),
        "into_s": into[0],
        "chat_ttft_s": first["chat"] - chat_at[0],
        "agents_s": max(done[f"a{i}"] for i in range(agents)) - t0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--left", type=float, nargs="+", default=[1.0, 0.5, 0.25, 0.1], help="seconds the step has left when the chat arrives")
    parser.add_argument("--grace-ms", type=int, default=300)
    parser.add_argument("--agents", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()

    import django

    django.setup()
    import llama_cpp

    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.engines.models import default_model_path

    engine = LlamaCppEngine(default_model_path(), n_lanes=8, lane_ctx=4096, n_threads=args.threads or None, cache_slots=0)
    engine.probe()
    grace_s = args.grace_ms / 1000
    print(f"{args.agents} agents (~1,000-token prompts) and a chat arriving R s before the end of the third 512-token prompt step; "
          f"llama-cpp-python {llama_cpp.__version__}, {engine.n_threads} threads, {time.strftime('%Y-%m-%d %H:%M')}\n")
    print(f"| R s | chat arrived s into the step (grace 0 / {args.grace_ms} ms) | work thrown away s (0 / {args.grace_ms} ms) "
          f"| chat TTFT s (0 / {args.grace_ms} ms) | agents' total s (0 / {args.grace_ms} ms) |")
    print("|--:|--:|--:|--:|--:|")
    for i, left in enumerate(args.left):
        off = one_run(engine, args.agents, left, 0.0, seed=i)
        on = one_run(engine, args.agents, left, grace_s, seed=i)
        print(f"| {left:.2f} | {off['into_s']:.2f} / {on['into_s']:.2f} | {off['thrown_s']:.2f} / {on['thrown_s']:.2f} | {off['chat_ttft_s']:.2f} / {on['chat_ttft_s']:.2f} "
              f"| {off['agents_s']:.1f} / {on['agents_s']:.1f} |", flush=True)
    engine.close()


if __name__ == "__main__":
    main()
