"""The package's fleet of real processes (conftest.py: two ``serve --redis URL --no-engine`` heads,
two ``runengine --redis URL`` workers with the bundled model, a redis-server of its own), which
test_celery.py's tests used before these: a late test here stops and starts its Redis, one
SIGKILLs a worker (and starts another), and the last one kills head 1."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.e2e.server import stream_text

from .conftest import LANES, MODEL, Fleet, start_worker, wait_until


def post(base: str, body: dict, headers: dict | None = None, timeout_s: float = 300) -> httpx.Response:
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    return httpx.post(base + path, json={"model": MODEL, "temperature": 0, **body}, headers=headers or {}, timeout=timeout_s)


def stream(base: str, body: dict, headers: dict | None, events: list[tuple[str, float]], name: str, texts: dict[str, str], progress: dict[str, int] | None = None) -> None:
    """Stream a completion, noting (name + ":first" / ":done", time) and the text."""
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"

    def on_chunk(n: int) -> None:
        if n == 1:
            events.append((name + ":first", time.monotonic()))
        if progress is not None:
            progress[name] = n

    request = {"_path": path, "model": MODEL, "temperature": 0, "stream": True, **body}
    text, _ = stream_text(base, request, headers, on_chunk, timeout_s=600)
    events.append((name + ":done", time.monotonic()))
    texts[name] = text


def test_eight_requests_through_both_heads_complete(fleet: Fleet) -> None:
    results: dict[int, httpx.Response] = {}

    def one(i: int) -> None:
        results[i] = post(fleet.heads[i % 2].base, {"prompt": f"Request {i}: the sky is", "max_tokens": 8})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(8))
    # the global queue ages classes with the workers' own period (16 s: 8 ticks of 2 s), not 2 s
    assert "waiting classes age every 16 s" in (Path(fleet.data_dir) / "worker0.log").read_text()
    for r in results.values():
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 8
    # both workers served some of them (each has LANES lanes, 8 arrived at once)
    state = fleet.heads[0].state()
    fleet_state = state.get("fleet") or []
    assert len(fleet_state) == 2 and {w["host"] for w in fleet_state}
    metrics = httpx.get(fleet.heads[1].base + "/metrics", timeout=10).text
    assert re.search(r"^superfluid_fleet_workers 2(\.0)?$", metrics, re.M), metrics
    assert len(re.findall(r"^superfluid_fleet_lanes_busy\{", metrics, re.M)) == 2
    assert re.search(r'^superfluid_global_queue_depth\{class="interactive"\} 0', metrics, re.M)


def test_an_interactive_chat_through_head_2_goes_before_background_agents_through_head_1(fleet: Fleet) -> None:
    events: list[tuple[str, float]] = []
    texts: dict[str, str] = {}
    background = [
        threading.Thread(target=stream, args=(fleet.heads[0].base, {"prompt": f"Agent {i} writes a long report:", "max_tokens": 48}, {"x-superfluid-qos": "background"}, events, f"bg{i}", texts))
        for i in range(8)
    ]
    for t in background:
        t.start()
    # every lane of the fleet is busy with background work and the rest waits in Redis
    wait_until(lambda: sum(1 for name, _ in list(events) if name.endswith(":first")) >= 2 * LANES, 300, "all lanes busy")
    chat = threading.Thread(target=stream, args=(fleet.heads[1].base, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}, {"x-superfluid-qos": "interactive"}, events, "chat", texts))
    chat.start()
    chat.join()
    names = [name for name, _ in events]
    started_before_chat = [n for n in names[: names.index("chat:first")] if n.endswith(":first")]
    assert len(started_before_chat) <= 2 * LANES  # no queued background job went ahead of it
    assert not any(n.endswith(":done") for n in names[: names.index("chat:done")])  # it preempted, it did not wait
    for t in background:
        t.join()
    assert len(texts) == 9


def test_sigkill_of_a_worker_with_greedy_streams_in_flight_loses_and_repeats_nothing(fleet: Fleet) -> None:
    # batch-invariant lanes: a greedy text does not depend on what else shares the batch (or on
    # which worker runs it), so the undisturbed run is a fair reference for a concurrent one
    invariant = {"x-superfluid-batch-invariant": "1"}
    prompts = {f"s{i}": f"Story {i}: once upon a time" for i in range(6)}
    reference: dict[str, str] = {}
    events: list[tuple[str, float]] = []
    for name, prompt in prompts.items():
        stream(fleet.heads[0].base, {"prompt": prompt, "max_tokens": 40}, invariant, events, name, reference)
    texts: dict[str, str] = {}
    progress: dict[str, int] = {}
    events.clear()
    threads = [threading.Thread(target=stream, args=(fleet.heads[i % 2].base, {"prompt": p, "max_tokens": 40}, invariant, events, n, texts, progress)) for i, (n, p) in enumerate(prompts.items())]
    for t in threads:
        t.start()
    # past the opening newlines: text resumed right after "\n\n" is tokenised as one token where
    # the model had produced two (a limit of resuming from text, the same with the local link)
    wait_until(lambda: len(progress) == 6 and min(progress.values()) >= 6, 300, "all six streams under way")
    # the worker holding jobs right now (its id is host:pid:tag)
    client = fleet.client()
    holders = {client.hget(k, "worker").decode() for k in client.scan_iter("sf:job:*")} - {""}
    assert holders, "no job is held by a worker"
    victim_pid = int(sorted(holders)[0].split(":")[1])
    victim = next(w for w in fleet.workers if w.pid == victim_pid)
    victim.kill()
    victim.wait()
    for t in threads:
        t.join()
    assert texts == reference
    # a replacement, for the tests after this one
    fleet.workers[fleet.workers.index(victim)] = start_worker(fleet.redis.url, fleet.data_dir, fleet.data_dir, 9)
    wait_until(lambda: fleet.live_workers() == 2, 120, "the replacement registered")


def test_rpm_4_key_across_both_heads_serves_exactly_4_of_8(fleet: Fleet) -> None:
    secret = fleet.createkey("fleet-rpm", "--rpm", "4")
    headers = {"authorization": f"Bearer {secret}"}
    # both heads know the key (they poll the shared database)
    for h in fleet.heads:
        wait_until(lambda h=h: httpx.get(h.base + "/v1/models", headers=headers, timeout=10).status_code == 200, 30, "the key is known")
    # all eight at once: the bucket gains a token every 15 s, and eight requests one after another
    # through a busy fleet once took longer than that (five were served)
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda i: post(fleet.heads[i % 2].base, {"prompt": "Hi", "max_tokens": 1}, headers), range(8)))
    codes = [r.status_code for r in replies]
    assert sorted(codes) == [200] * 4 + [429] * 4, codes
    assert {r.json()["error"]["code"] for r in replies if r.status_code == 429} == {"rate_limit_exceeded"}


def test_redis_stopped_answers_503_with_retry_after_and_serving_resumes_when_it_returns(fleet: Fleet) -> None:
    pids = [h.proc.pid for h in fleet.heads if h.proc is not None] + [w.pid for w in fleet.workers]
    fleet.redis.stop()
    try:
        def refused() -> httpx.Response | None:
            r = post(fleet.heads[1].base, {"prompt": "Hi", "max_tokens": 1}, timeout_s=30)
            return r if r.status_code == 503 else None

        r = wait_until(refused, 30, "503 while Redis is down")
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "engine_unavailable"
    finally:
        fleet.redis.start()
    for h in fleet.heads:
        # generous bounds: on a loaded machine one tiny completion has taken over a minute
        wait_until(lambda h=h: post(h.base, {"prompt": "Hi", "max_tokens": 2}, timeout_s=240).status_code == 200, 300, "serving again")
    alive = [h.proc.pid for h in fleet.heads if h.proc is not None and h.proc.poll() is None] + [w.pid for w in fleet.workers if w.poll() is None]
    assert alive == pids  # nothing was restarted


BODY = {"model": MODEL, "temperature": 0, "stream": True, "max_tokens": 96, "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}]}


def frames(lines: Iterator[str]) -> Iterator[tuple[str | None, str]]:
    """(id, data) per SSE event."""
    event_id: str | None = None
    for line in lines:
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            yield event_id, line[6:]
            event_id = None


def content(data: list[str]) -> str:
    out = []
    for d in data:
        if d != "[DONE]":
            for choice in json.loads(d).get("choices", []):
                out.append((choice.get("delta") or {}).get("content") or "")
    return "".join(out)


def test_a_client_whose_head_died_gets_exactly_the_rest_from_another_head(fleet: Fleet) -> None:
    """Last-Event-ID across real heads: a client reads part of a stream from head 1, head 1 is
    SIGKILLed (its client's connection dies with it), and the client reconnects to head 2 with
    the last SSE id it saw: it gets exactly the rest of the reply, every delta once. Last in this
    package (conftest.py): head 1 stays dead. (A reference run of the same request says the same
    text, finish and usage, but not in the same frames: --stream-interval-ms groups a reply's
    tokens by time.)"""
    one, two = fleet.heads
    with httpx.stream("POST", two.base + "/v1/chat/completions", json=BODY, timeout=300) as r:
        assert r.status_code == 200
        reference = [d for _, d in frames(r.iter_lines())]
    assert reference[-1] == "[DONE]" and len(reference) > 12

    seen: list[tuple[str | None, str]] = []
    with httpx.stream("POST", one.base + "/v1/chat/completions", json=BODY, timeout=300) as r:
        assert r.status_code == 200
        for event_id, data in frames(r.iter_lines()):
            seen.append((event_id, data))
            if len(seen) == 6:
                break
        assert one.proc is not None
        one.proc.kill()  # the head dies mid-stream: nothing cancels the job
        one.proc.wait()
    last_id = seen[-1][0]
    assert last_id is not None and all(i is not None and i.rsplit(":", 1)[0] == last_id.rsplit(":", 1)[0] for i, _ in seen), seen

    with httpx.stream("POST", two.base + "/v1/chat/completions", json=BODY, headers={"last-event-id": last_id}, timeout=300) as r:
        assert r.status_code == 200, r.read()
        rest_frames = list(frames(r.iter_lines()))
    rest = [d for _, d in rest_frames]
    got = [d for _, d in seen] + rest
    # the same reply (the reply's id too), nothing repeated, nothing lost: the frames' delta
    # numbers (id: <job>:<n>) go on from the last one seen, one by one
    assert content(got) == content(reference)
    numbers = [int(i.rsplit(":", 1)[1]) for i, _ in seen + rest_frames if i is not None]
    assert numbers[len(seen)] == numbers[len(seen) - 1] + 1
    assert all(b - a in (0, 1) for a, b in zip(numbers, numbers[1:], strict=False)), numbers
    assert got[-1] == reference[-1] == "[DONE]"
    assert json.loads(got[-2])["choices"][0]["finish_reason"] == json.loads(reference[-2])["choices"][0]["finish_reason"]
    assert len({json.loads(d)["id"] for d in got if d != "[DONE]"}) == 1

    # the stream is gone once answered; an id this server never sent is refused
    again = httpx.post(two.base + "/v1/chat/completions", json=BODY, headers={"last-event-id": last_id}, timeout=60)
    assert again.status_code == 404 and again.json()["error"]["code"] == "not_found"
    for nonsense in (b"nonsense", last_id.rpartition(":")[0].encode() + b":\xb2"):  # a superscript two: str.isdigit() says yes
        bad = httpx.post(two.base + "/v1/chat/completions", json=BODY, headers={"last-event-id": nonsense}, timeout=60)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "Last-Event-ID", bad.text
