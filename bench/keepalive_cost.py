"""What a stream's keepalive costs the web process per event: a stream waits on its job's event
queue once per delta it writes, and with ``--sse-keepalive`` on (the default) that wait runs
under a timeout (``GenerationConsumer.beating``), so it is paid once per token per stream.

Each side reads N events that a producer task puts one per turn of the event loop (as the link
reader puts a tick's deltas), interleaved over ``--repeat`` rounds; the table gives the median
microseconds per event:
- plain: ``await queue.get()`` (``--sse-keepalive 0``);
- keepalive: ``GenerationConsumer.beating(queue.get)`` with a 15 s interval (no beat falls);
- task + asyncio.wait: the first version of the keepalive (the wait a task watched by
  ``asyncio.wait`` with a timeout), kept for the comparison.

    python bench/keepalive_cost.py [--events 50000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "superfluid_site.settings")


async def _task_and_wait(get: Callable[[], Awaitable[Any]], interval: float = 15.0) -> Any:
    waiting = asyncio.ensure_future(get())
    try:
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=interval)
            if done:
                return waiting.result()
    finally:
        if not waiting.done():
            waiting.cancel()


async def _per_event_us(wait: Callable[[asyncio.Queue[int]], Awaitable[int]], n: int) -> float:
    queue: asyncio.Queue[int] = asyncio.Queue()

    async def producer() -> None:
        for i in range(n):
            queue.put_nowait(i)
            await asyncio.sleep(0)

    task = asyncio.ensure_future(producer())
    start = time.perf_counter()
    for _ in range(n):
        await wait(queue)
    elapsed = time.perf_counter() - start
    await task
    return elapsed / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import django

    django.setup()
    from api.consumers import GenerationConsumer
    from superfluid_site.serving import ServingConfig, installed

    stream = SimpleNamespace(send_body=None, keepalive_event=lambda: b": keepalive\n\n")
    sides: dict[str, Callable[[asyncio.Queue[int]], Awaitable[int]]] = {
        "plain (--sse-keepalive 0)": lambda q: q.get(),
        "keepalive (beating, 15 s)": lambda q: GenerationConsumer.beating(stream, q.get),  # type: ignore[arg-type]
        "task + asyncio.wait (first version)": lambda q: _task_and_wait(q.get),
    }
    results: dict[str, list[float]] = {name: [] for name in sides}
    with installed(ServingConfig.from_settings(sse_keepalive=15)):
        for _ in range(args.repeat):
            for name, wait in sides.items():
                results[name].append(asyncio.run(_per_event_us(wait, args.events)))
    plain = statistics.median(results["plain (--sse-keepalive 0)"])
    print(f"{args.events} events a side, median of {args.repeat} interleaved rounds, Python {sys.version.split()[0]}")
    print("| side | us per event | over plain |")
    print("|---|--:|--:|")
    for name, values in results.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {median - plain:+.2f} |")


if __name__ == "__main__":
    main()
