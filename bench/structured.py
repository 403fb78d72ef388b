"""Do constrained requests batch with free ones? Aggregate decode throughput of 8 concurrent
chat requests where half carry a JSON Schema (``response_format``), against 8 unconstrained ones.

Every request generates ``--max-tokens`` tokens: free ones with ``ignore_eos``, constrained ones
because the schema's ``summary`` must be longer than that (``minLength``), so the grammar is
walked for every token and no lane finishes early. tokens/s = completion tokens / wall time from
the first request to the last reply. Prints the two rates and their ratio (the issue asks for at
least 0.9). Needs a quiet machine: on a shared one the ratio is noise.

    python bench/structured.py [--max-tokens 96] [--repeat 3] [--streams 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scheduler.engines.models import default_model_path, model_name_for  # noqa: E402
from testkit.harness import RunningServer  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "year": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "summary": {"type": "string", "minLength": 2000},
    },
    "required": ["title", "year", "tags", "summary"],
}
TOPICS = ["a lighthouse keeper", "a lost robot", "a dragon who bakes", "the first city on Mars",
          "a talking cat", "a haunted library", "a river that flows uphill", "an old violin"]


def one(base: str, model: str, i: int, max_tokens: int, constrained: bool) -> int:
    body: dict = {"model": model, "max_tokens": max_tokens, "temperature": 0,
                  "messages": [{"role": "user", "content": f"Describe a book about {TOPICS[i % len(TOPICS)]}."}]}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "book", "schema": SCHEMA}}
    else:
        body["ignore_eos"] = True
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=900)
    r.raise_for_status()
    return int(r.json()["usage"]["completion_tokens"])


def run(base: str, model: str, streams: int, max_tokens: int, mixed: bool) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        counts = list(pool.map(lambda i: one(base, model, i, max_tokens, mixed and i % 2 == 0), range(streams)))
    return sum(counts) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--streams", type=int, default=8)
    args = ap.parse_args()
    model = model_name_for(default_model_path())
    server = RunningServer("--max-batch", str(args.streams), "--ctx-size", "1024").start()
    try:
        run(server.base, model, args.streams, 8, True)  # warm-up: grammar paths, caches
        free, mixed = [], []
        for _ in range(args.repeat):
            free.append(run(server.base, model, args.streams, args.max_tokens, False))
            mixed.append(run(server.base, model, args.streams, args.max_tokens, True))
    finally:
        server.stop()
    f, m = statistics.median(free), statistics.median(mixed)
    print(f"| {args.streams} requests | tokens/s (median of {args.repeat}) |")
    print("|---|---|")
    print(f"| unconstrained | {f:.1f} |")
    print(f"| half with a JSON Schema | {m:.1f} |")
    print(f"| ratio | {m / f:.2f} |")


if __name__ == "__main__":
    main()
