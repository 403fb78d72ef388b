"""Decode throughput when streams end at different times: lane compaction against none.

Eight greedy streams whose lengths differ (in lane order 8, 1, 7, 2, 6, 3, 5, 4 times
``--max-tokens``/8, with ``ignore_eos``), so the short ones finish in the middle of the busy lanes.
llama.cpp with a KV stream per sequence runs a decode round in one pass over the weights per
run of consecutive busy lanes; superfluid moves the job in the highest busy lane into the gap
(docs/scheduling.md#lane-compaction). Sides, interleaved, each repetition starting with the next:
- worker, compacting: superfluid's worker over the real engine in this process, no HTTP;
- worker, not compacting: the same with ``compact_lanes`` off (what it did before);
- superfluid: the same streams over HTTP to ``manage.py serve``, sent 50 ms apart so each
  takes the next lane;
- llama-server (with ``--peer llama-server``): the same requests, as bench/throughput.py.
For the worker sides, "passes" is the mean number of runs of busy lanes per decode round.

    python bench/lane_gaps.py [--max-tokens 256] [--repeat 3] [--peer llama-server]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peers import in_turn, start_peer  # noqa: E402
from bench.scenarios import LLAMA_SERVER_ARGS  # noqa: E402
from bench.throughput import client, prompts, run_worker_inprocess  # noqa: E402
from scheduler.core.scheduler import lane_runs  # noqa: E402
from scheduler.engines.models import default_model_path, model_name_for  # noqa: E402
from testkit.harness import RunningServer  # noqa: E402

SHARES = (8, 1, 7, 2, 6, 3, 5, 4)  # eighths of --max-tokens, in lane order


def lengths(max_tokens: int) -> list[int]:
    return [max(1, max_tokens * s // 8) for s in SHARES]


def worker_side(engine: Any, texts: list[str], ns: list[int], compact: bool) -> dict[str, float]:
    from scheduler.core.types import TickPlan

    # the last side's kept lanes: every side starts from empty lanes
    engine.execute(TickPlan(tick=0, release=list(range(engine.n_lanes))), lambda: False)
    passes: list[int] = []
    moves: list[int] = [0]

    def on_tick(worker: Any) -> None:
        plan = worker.scheduler.last_plan
        decode = [f.lane for f in plan.feeds if f.is_decode] if plan is not None else []
        if decode:
            passes.append(lane_runs(decode))
        moves[0] = worker.scheduler.counters["lane_moves"]

    requests = [
        {"endpoint": "completions", "prompt": text, "max_tokens": n, "temperature": 0.0, "ignore_eos": True}
        for text, n in zip(texts, ns, strict=True)
    ]
    run = run_worker_inprocess(engine, requests, compact_lanes=compact, on_tick=on_tick)
    return {"seconds": run["seconds"], "tokens_per_s": run["tokens_per_s"], "passes": statistics.mean(passes), "moves": moves[0]}


def http_side(base: str, model: str, texts: list[str], ns: list[int]) -> dict[str, float]:
    def stream(i: int) -> int:
        time.sleep(0.05 * i)  # in order: each request takes the next lane
        body = {"model": model, "prompt": texts[i], "max_tokens": ns[i], "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        n = 0
        with client().stream("POST", base + "/v1/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: {") and '"choices"' in line:
                    n += 1
        return n

    start = time.perf_counter()
    with ThreadPoolExecutor(len(texts)) as pool:
        list(pool.map(stream, range(len(texts))))
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens_per_s": sum(ns) / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peer", choices=["llama-server"])
    parser.add_argument("--peer-args", default=LLAMA_SERVER_ARGS)
    args = parser.parse_args()
    from scheduler.engines.llama_cpp import LlamaCppEngine

    model_path = default_model_path()
    model = model_name_for(model_path)
    ns = lengths(args.max_tokens)
    engine = LlamaCppEngine(model_path, n_lanes=8)
    server = RunningServer("--max-batch", "8").start()
    peer = start_peer(model_path, args.peer_args) if args.peer == "llama-server" else None
    results: dict[str, list[dict[str, float]]] = {}
    try:
        for rep in range(args.repeat):
            texts = prompts(8, rep + 1)
            sides: list[tuple[str, Callable[[], dict[str, float]]]] = [
                ("worker, compacting", partial(worker_side, engine, texts, ns, True)),
                ("worker, not compacting", partial(worker_side, engine, texts, ns, False)),
                ("superfluid (HTTP)", partial(http_side, server.base, model, texts, ns)),
            ]
            if peer is not None:
                sides.append(("llama-server (HTTP)", partial(http_side, peer.base, model, texts, ns)))
            for name, run in in_turn(sides, rep):
                results.setdefault(name, []).append(run())
            print(f"  run {rep + 1}: " + ", ".join(f"{n} {r[-1]['seconds']:.2f} s" for n, r in results.items()), file=sys.stderr)
    finally:
        server.stop()
        engine.close()
        if peer is not None:
            peer.stop()

    base = statistics.median(r["seconds"] for r in results["worker, not compacting"])
    peer_s = statistics.median(r["seconds"] for r in results["llama-server (HTTP)"]) if peer is not None else None
    print(f"\n8 greedy streams of {', '.join(map(str, ns))} tokens (lanes 0-7), {model}, median of {args.repeat}\n")
    print("| side | s | tok/s | / worker not compacting (time) |" + (" / llama-server (time) |" if peer_s else "") + " passes per round | moves |")
    print("|---|--:|--:|--:|" + ("--:|" if peer_s else "") + "--:|--:|")
    for name, rows in results.items():
        s = statistics.median(r["seconds"] for r in rows)
        tps = statistics.median(r["tokens_per_s"] for r in rows)
        passes = f"{statistics.median(r['passes'] for r in rows):.2f}" if "passes" in rows[0] else ""
        moves = f"{statistics.median(r['moves'] for r in rows):.0f}" if "moves" in rows[0] else ""
        cells = f"| {name} | {s:.2f} | {tps:.1f} | {s / base:.3f} |" + (f" {s / peer_s:.3f} |" if peer_s else "")
        print(cells + f" {passes} | {moves} |")


if __name__ == "__main__":
    main()
