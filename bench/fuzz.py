"""Fire generated hostile requests at a running server and count what comes back.

    python -m bench.fuzz --url http://127.0.0.1:8000 [-n 10000] [--concurrency 8] [--time-limit 900]

The requests come from the Hypothesis strategies of the in-process fuzz test
(tests/edge/strategies.py): hostile bodies (lone surrogates as escapes and raw CESU-8 bytes,
control tokens, truncated and UTF-16 JSON, huge numbers, wrong types), hostile headers (400-digit
priorities, foreign origins, junk keys) and wrong methods and routes. It prints a table of
status codes, replies under /v1 that are not JSON, hangs (no reply within --request-timeout)
and engine worker restarts (from /health), then checks that a normal request is still served.

Loopback only (the server must be on this machine), bounded in count (-n) and time
(--time-limit: what is not sent by then is not sent).
"""

from __future__ import annotations

import argparse
import collections
import ipaddress
import json
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def generate(n: int, seed: int) -> list:  # type: ignore[type-arg]
    """``n`` hostile requests, drawn by Hypothesis (generation only: no shrinking, no database)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from tests.edge.strategies import hostile_requests

    cases: list = []  # type: ignore[type-arg]

    @hypothesis_seed(seed)
    @settings(max_examples=n, database=None, phases=[Phase.generate], deadline=None, suppress_health_check=list(HealthCheck))
    @given(hostile_requests())
    def collect(case) -> None:  # type: ignore[no-untyped-def]
        cases.append(case)

    collect()
    return cases[:n]


def require_loopback(url: str) -> None:
    host = urlsplit(url).hostname or ""
    addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    if not addresses or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        raise SystemExit(f"bench/fuzz.py only fires at a server on this machine; {host} is not loopback")


@dataclass
class Outcome:
    path: str
    status: int | None  # None: no reply in time (a hang) or the connection failed
    json_ok: bool
    error: str = ""
    case: object = None


def fire(client: httpx.Client, base: str, case, timeout_s: float) -> Outcome:  # type: ignore[no-untyped-def]
    headers = {k: v.encode("latin-1") for k, v in case.headers.items()}
    try:
        r = client.request(case.method, base + case.path, content=case.body, headers=headers, timeout=timeout_s)
    except httpx.TimeoutException:
        return Outcome(case.path, None, True, "hang", case)
    except httpx.LocalProtocolError:
        return Outcome(case.path, None, True, "unsendable", case)  # h11 would not send that header
    except httpx.HTTPError as exc:
        return Outcome(case.path, None, True, type(exc).__name__, case)
    json_ok = True
    if case.path.startswith("/v1") and not r.headers.get("content-type", "").startswith("text/event-stream"):
        try:
            json.loads(r.content)
        except ValueError:
            json_ok = False
    return Outcome(case.path, r.status_code, json_ok, "" if json_ok else r.content[:120].decode("latin-1"), case)


def worker_restarts(base: str) -> int | None:
    try:
        return int(httpx.get(base + "/health", timeout=10).json().get("worker_restarts", 0))
    except (httpx.HTTPError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("-n", "--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--time-limit", type=float, default=900.0, help="seconds; requests not sent by then are skipped")
    parser.add_argument("--request-timeout", type=float, default=60.0, help="seconds without a full reply that count as a hang")
    parser.add_argument("--seed", type=int, default=10)
    parser.add_argument("--show", type=int, default=10, help="print this many of the failing requests")
    parser.add_argument("--model", default="", help="the served model id (default: the first of /v1/models)")
    args = parser.parse_args(argv)
    base = args.url.rstrip("/")
    require_loopback(base)
    if not 1 <= args.requests <= 100_000 or not 1 <= args.concurrency <= 64:
        raise SystemExit("-n must be 1..100000 and --concurrency 1..64")

    model = args.model or httpx.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]
    t0 = time.monotonic()
    cases = generate(args.requests, args.seed)
    for case in cases:  # the strategies name the model "sim"; aim them at the served one
        case.body = case.body.replace(b'"sim"', json.dumps(model).encode())
        if case.path == "/v1/models/sim":
            case.path = f"/v1/models/{model}"
    print(f"generated {len(cases)} requests in {time.monotonic() - t0:.1f} s", flush=True)

    restarts_before = worker_restarts(base)
    deadline = time.monotonic() + args.time_limit
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    skipped = 0
    local = threading.local()

    def run(case) -> None:  # type: ignore[no-untyped-def]
        nonlocal skipped
        if time.monotonic() > deadline:
            with lock:
                skipped += 1
            return
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = httpx.Client()
        outcome = fire(client, base, case, args.request_timeout)
        with lock:
            outcomes.append(outcome)
            if len(outcomes) % 1000 == 0:
                print(f"  {len(outcomes)} sent", flush=True)

    started = time.monotonic()
    with ThreadPoolExecutor(args.concurrency) as pool:
        list(pool.map(run, cases))
    elapsed = time.monotonic() - started
    restarts_after = worker_restarts(base)
    after = httpx.post(base + "/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}, timeout=60)

    statuses = collections.Counter(o.status for o in outcomes if o.status is not None)
    hangs = sum(1 for o in outcomes if o.error == "hang")
    unsendable = sum(1 for o in outcomes if o.error == "unsendable")
    failed = collections.Counter(o.error for o in outcomes if o.status is None and o.error not in ("hang", "unsendable"))
    non_json = sum(1 for o in outcomes if not o.json_ok)
    five = sum(n for s, n in statuses.items() if s >= 500)
    restarts = None if restarts_before is None or restarts_after is None else restarts_after - restarts_before

    print(f"\n{len(outcomes)} hostile requests in {elapsed:.1f} s ({len(outcomes) / max(elapsed, 1e-9):.0f}/s, concurrency {args.concurrency}, seed {args.seed})" + (f", {skipped} skipped at the time limit" if skipped else ""))
    print("\n| status | count |\n|---:|---:|")
    for status, count in sorted(statuses.items()):
        print(f"| {status} | {count} |")
    print("\n| check | count |\n|---|---:|")
    print(f"| 5xx replies | {five} |")
    print(f"| non-JSON replies under /v1 | {non_json} |")
    print(f"| hangs (no reply in {args.request_timeout:.0f} s) | {hangs} |")
    for error, count in sorted(failed.items()):
        print(f"| connection failures ({error}) | {count} |")
    print(f"| engine worker restarts | {restarts if restarts is not None else '?'} |")
    print(f"| not sent: the HTTP client refused a header value | {unsendable} |")
    print(f"| normal request afterwards | {after.status_code} |")
    for o in [o for o in outcomes if not o.json_ok or (o.status is None and o.error != "unsendable") or (o.status or 0) >= 500][: args.show]:
        case = o.case
        print(f"\n{o.status} {o.error!r}: {case.method} {case.path} headers={case.headers!r} body={case.body[:160]!r}")  # type: ignore[attr-defined]
    bad = five or non_json or hangs or failed or restarts or after.status_code != 200
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
