"""Tokens/s through the Redis link against the local link, on one machine, and what the Redis
hop adds to each token's latency.

Two servers run one after the other with the same flags and the same engine worker:
- local: ``manage.py serve`` (the worker on its private socketpair);
- redis: a ``redis-server`` of this script's own on loopback and ``manage.py serve --redis URL``
  (the same head and one local worker, but every job goes through the Redis queue and its tokens
  back through a Redis Stream).
For each stream count N, N concurrent greedy streamed /v1/completions requests of
``--max-tokens`` each, ``--repeat`` times; tokens/s = completion tokens / wall time from the
first request to the last token. Every token's arrival time at the client is kept: the gaps
between a stream's tokens (p50/p99) and the time to first token, per link; "added" is redis
minus local (the engine's tick is the same on both, so the difference is the Redis hop: the
worker's emit script, Redis, the head's XREAD). Goal: redis/local >= 0.95.

    python bench/redis_link.py [--streams 1,4,8] [--max-tokens 128] [--repeat 3] [--max-batch 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.throughput import prompts  # noqa: E402
from scheduler.engines.models import default_model_path, model_name_for  # noqa: E402
from testkit.harness import RunningServer  # noqa: E402


def one_stream(base: str, model: str, prompt: str, max_tokens: int, t0: float) -> tuple[int, list[float]]:
    """(completion tokens, arrival times of each text chunk relative to ``t0``)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    tokens, arrivals = 0, []
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if any(c.get("text") for c in event.get("choices", [])):
                arrivals.append(time.perf_counter() - t0)
    return tokens, arrivals


def run(base: str, model: str, n: int, max_tokens: int) -> dict[str, object]:
    texts = prompts(n)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(lambda p: one_stream(base, model, p, max_tokens, t0), texts))
    wall = time.perf_counter() - t0
    tokens = sum(r[0] for r in results)
    gaps = [b - a for _, arr in results for a, b in zip(arr, arr[1:], strict=False)]
    ttft = [arr[0] for _, arr in results if arr]
    return {"tps": tokens / wall, "gaps": gaps, "ttft": ttft}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(server: RunningServer, model: str, streams: list[int], max_tokens: int, repeat: int) -> dict[int, dict[str, object]]:
    out: dict[int, dict[str, object]] = {}
    run(server.base, model, 1, 8)  # warm up: first-request costs are no one's throughput
    for n in streams:
        runs = [run(server.base, model, n, max_tokens) for _ in range(repeat)]
        out[n] = {
            "tps": statistics.median(float(r["tps"]) for r in runs),  # type: ignore[arg-type]
            "gaps": [g for r in runs for g in r["gaps"]],  # type: ignore[attr-defined]
            "ttft": [t for r in runs for t in r["ttft"]],  # type: ignore[attr-defined]
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1,4,8")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=0, help="engine threads (0: the worker's default)")
    args = parser.parse_args()
    streams = [int(s) for s in args.streams.split(",")]
    model = model_name_for(default_model_path())
    flags = ["--max-batch", str(args.max_batch), "--http-allow-batch-invariant"]
    if args.threads:
        flags += ["--threads", str(args.threads)]

    from tests.redis.conftest import RedisServer  # the tests' throwaway redis-server on loopback

    results: dict[str, dict[int, dict[str, object]]] = {}
    local = RunningServer(*flags).start(300)
    try:
        results["local"] = measure(local, model, streams, args.max_tokens, args.repeat)
    finally:
        local.stop()
    redis_server = RedisServer().start()
    try:
        remote = RunningServer(*flags, "--redis", redis_server.url).start(300)
        try:
            results["redis"] = measure(remote, model, streams, args.max_tokens, args.repeat)
        finally:
            remote.stop()
    finally:
        redis_server.stop()

    print(f"\nmodel {model}, --max-batch {args.max_batch}, {args.max_tokens} tokens a stream, median of {args.repeat} runs")
    print("| streams | local tok/s | redis tok/s | redis/local | token gap p50 local / redis / added (ms) | token gap p99 local / redis / added (ms) | TTFT p50 added (ms) |")
    print("|---|---|---|---|---|---|---|")
    for n in streams:
        lo, re_ = results["local"][n], results["redis"][n]
        g50 = (pct(lo["gaps"], 0.5) * 1e3, pct(re_["gaps"], 0.5) * 1e3)  # type: ignore[arg-type]
        g99 = (pct(lo["gaps"], 0.99) * 1e3, pct(re_["gaps"], 0.99) * 1e3)  # type: ignore[arg-type]
        t50 = (pct(re_["ttft"], 0.5) - pct(lo["ttft"], 0.5)) * 1e3  # type: ignore[arg-type]
        ratio = float(re_["tps"]) / float(lo["tps"])  # type: ignore[arg-type]
        print(
            f"| {n} | {float(lo['tps']):.1f} | {float(re_['tps']):.1f} | {ratio:.2f} | "  # type: ignore[arg-type]
            f"{g50[0]:.1f} / {g50[1]:.1f} / {g50[1] - g50[0]:+.1f} | {g99[0]:.1f} / {g99[1]:.1f} / {g99[1] - g99[0]:+.1f} | {t50:+.1f} |"
        )


if __name__ == "__main__":
    main()
