"""N clients drop after their first chunk, all at once: how long until every lane and queue is
free, and whether every request still got its activity-log row.

    python -m bench.drop_burst --url http://127.0.0.1:8000 --db DATA_DIR/superfluid.sqlite3 [-n 1000]

Each client opens a streaming chat request on its own connection and closes the connection as
soon as the first SSE chunk has arrived. Once all have closed, /v1/internal/state is polled
until no lane is busy and no queue holds a job; then the activity rows written since the start
are counted (read-only, from the SQLite file). Loopback only; the server must have been
started with keys optional (or pass --key with an admin key), and with --client-concurrency 0
and --max-queue 0 (or above N): every client comes from 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # also run as python bench/drop_burst.py

from bench.fuzz import require_loopback  # noqa: E402


async def one_client(host: str, port: int, body: bytes, first_chunk: asyncio.Event, key: str) -> bool:
    reader, writer = await asyncio.open_connection(host, port)
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    writer.write(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n{auth}Content-Length: {len(body)}\r\n\r\n".encode() + body
    )
    await writer.drain()
    got = b""
    try:
        while b"data: " not in got:
            if b"\r\n\r\n" in got and not got.startswith(b"HTTP/1.1 200"):
                return False  # refused (429/503): not a stream
            chunk = await asyncio.wait_for(reader.read(4096), 120)
            if not chunk:
                return False
            got += chunk
        return got.startswith(b"HTTP/1.1 200")
    except TimeoutError:
        return False
    finally:
        writer.close()  # gone after the first chunk
        first_chunk.set()


def busy(state: dict) -> tuple[int, int]:  # type: ignore[type-arg]
    return int(state.get("lanes_active", 0)), sum(state.get("queue_depth", {}).values())


async def run(args: argparse.Namespace) -> int:
    parts = urlsplit(args.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    headers = {"authorization": f"Bearer {args.key}"} if args.key else {}
    async with httpx.AsyncClient(timeout=30) as client:
        model = (await client.get(args.url + "/v1/models", headers=headers)).json()["data"][0]["id"]
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Write a long story about the sea."}], "stream": True, "max_tokens": 400}).encode()
    db = sqlite3.connect(f"file:{args.db}?mode=ro", uri=True) if args.db else None
    rows_before = db.execute("select count(*) from activity_activityentry").fetchone()[0] if db else 0
    first = asyncio.Event()
    t0 = time.monotonic()
    results = await asyncio.gather(*(one_client(host, port, body, first, args.key) for _ in range(args.clients)))
    all_closed = time.monotonic()
    served = sum(results)
    freed_s = None
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=10) as client:
        while time.monotonic() - all_closed < args.wait:
            state = (await client.get("/v1/internal/state")).json()
            if busy(state) == (0, 0):
                freed_s = time.monotonic() - all_closed
                break
            await asyncio.sleep(0.05)
        final = busy((await client.get("/v1/internal/state")).json())
    rows = None
    if db is not None:
        deadline = time.monotonic() + args.wait
        while True:
            rows = db.execute("select count(*) from activity_activityentry").fetchone()[0] - rows_before
            if rows >= args.clients or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        rows_at = time.monotonic() - all_closed
    print(f"{args.clients} clients, {served} got a first chunk (200) in {all_closed - t0:.1f} s, then all dropped")
    print("\n| measure | value |\n|---|---:|")
    print(f"| lanes and queues free after the last drop | {f'{freed_s:.2f} s' if freed_s is not None else f'not within {args.wait:.0f} s'} |")
    print(f"| lanes busy, jobs queued at the end | {final[0]}, {final[1]} |")
    if rows is not None:
        print(f"| activity rows written (of {args.clients}) | {rows} ({rows_at:.1f} s after the last drop) |")
    return 0 if freed_s is not None and final == (0, 0) and (rows is None or rows >= args.clients) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("-n", "--clients", type=int, default=1000)
    parser.add_argument("--db", default="", help="the server's SQLite file, to count activity rows")
    parser.add_argument("--key", default="", help="an admin key, when the server requires keys")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the lanes to free and the rows to land")
    args = parser.parse_args(argv)
    args.url = args.url.rstrip("/")
    require_loopback(args.url)
    if not 1 <= args.clients <= 5000:
        raise SystemExit("-n must be 1..5000")
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
