"""Where the engine worker's time goes beside ``llama_decode``, per tick, at N streams.

The in-process worker (scheduler, real engine, text output and link messages; no HTTP) streams
greedy completions while each part of its tick is timed (a wrapper around each method, ~1 us
each); the table shows each part's median per tick and the decode's, and what the tick spends
outside the decode. Then the bare loop (``bench/bare_loop.py``) at the same streams, alternating
a context of one sequence per stream with one of the worker's lane count, to see whether the
context's shape (8 KV streams where one is used) costs the decode anything.

    python bench/tick_overhead.py [--streams 1] [--lanes 8] [--max-tokens 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bare_loop import run_bare_loop  # noqa: E402
from bench.throughput import prompts, run_worker_inprocess  # noqa: E402
from scheduler.engines.models import default_model_path  # noqa: E402

# (class path, method, label): the parts of a tick, outermost first
PARTS = [
    ("scheduler.worker.loop:EngineWorker", "run_tick", "whole tick"),
    ("scheduler.core.scheduler:Scheduler", "step", "plan (Scheduler.step)"),
    ("scheduler.engines.llama_cpp:LlamaCppEngine", "execute", "engine (execute)"),
    ("scheduler.engines.llama_cpp:LlamaCppEngine", "forward", "of it, forward"),
    ("scheduler.worker.loop:EngineWorker", "_commit", "commit (events, text, messages)"),
    ("scheduler.core.scheduler:Scheduler", "commit", "of it, Scheduler.commit"),
    ("scheduler.worker.metrics:WorkerMetrics", "on_tick", "metrics"),
    ("scheduler.worker.server:Connection", "flush", "link flush"),
]


def _timed(samples: dict[str, list[int]]) -> Callable[[], None]:
    """Wrap each part's method to record its time; returns the undo."""
    import importlib

    undo = []
    for where, name, label in PARTS:
        module, cls_name = where.split(":")
        cls = getattr(importlib.import_module(module), cls_name)
        original = getattr(cls, name)

        def wrapper(*args: Any, _f: Any = original, _label: str = label, **kwargs: Any) -> Any:
            start = time.perf_counter_ns()
            try:
                return _f(*args, **kwargs)
            finally:
                samples.setdefault(_label, []).append(time.perf_counter_ns() - start)

        setattr(cls, name, functools.wraps(original)(wrapper))
        undo.append((cls, name, original))

    def restore() -> None:
        for cls, name, original in undo:
            setattr(cls, name, original)

    return restore


def worker_run(model: Path, lanes: int, streams: int, max_tokens: int) -> dict[str, float]:
    from scheduler.engines.llama_cpp import LlamaCppEngine

    samples: dict[str, list[int]] = {}
    engine = LlamaCppEngine(model, n_lanes=lanes)
    decode: list[int] = []
    undo = _timed(samples)
    try:
        requests = [{"endpoint": "completions", "prompt": t, "max_tokens": max_tokens, "temperature": 0.0} for t in prompts(streams)]
        # a tick a round (no decode bursts): the parts' cost per round
        result = run_worker_inprocess(engine, requests, on_tick=lambda _w: decode.append(int(engine._decode_s * 1e9)), stream_interval_ms=0)
    finally:
        undo()
        engine.close()
    samples["of it, llama_decode"] = decode
    # the prompt ticks first: the decode rounds' medians
    medians = {label: statistics.median(v[5:] or v) / 1e3 for label, v in samples.items()}
    medians["tok/s"] = result["tokens_per_s"]
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    model = default_model_path()
    runs = [worker_run(model, args.lanes, args.streams, args.max_tokens) for _ in range(args.repeat)]
    labels = [label for _, _, label in PARTS] + ["of it, llama_decode"]
    print(f"worker, {args.streams} stream(s), {args.lanes} lanes, medians per tick over {args.repeat} runs")
    print("| part | us per tick |")
    print("|---|--:|")
    for label in labels:
        print(f"| {label} | {statistics.median(r[label] for r in runs if label in r):.1f} |")
    outside = statistics.median(r["whole tick"] - r["of it, llama_decode"] for r in runs)
    share = statistics.median((r["whole tick"] - r["of it, llama_decode"]) / r["whole tick"] for r in runs)
    print(f"| outside llama_decode | {outside:.1f} ({share:.1%} of the tick) |")
    print(f"| worker tok/s | {statistics.median(r['tok/s'] for r in runs):.1f} |")
    texts = prompts(args.streams)
    own, shaped = [], []
    for _ in range(args.repeat):  # alternating, so a drift of the machine's speed hits both
        own.append(run_bare_loop(model, texts, args.max_tokens)["decode_tokens_per_s"])
        shaped.append(run_bare_loop(model, texts, args.max_tokens, seqs=args.lanes)["decode_tokens_per_s"])
    print()
    print(f"bare loop, {args.streams} stream(s), decode tok/s (medians of {args.repeat}, alternating)")
    print(f"| context of {args.streams} sequence(s) | context of {args.lanes} | ratio |")
    print("|--:|--:|--:|")
    print(f"| {statistics.median(own):.1f} | {statistics.median(shaped):.1f} | {statistics.median(shaped) / statistics.median(own):.3f} |")


if __name__ == "__main__":
    main()
