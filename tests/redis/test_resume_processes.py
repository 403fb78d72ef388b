"""Last-Event-ID across real heads: a client reads part of a stream from head 1, head 1 is
SIGKILLed (its client's connection dies with it), and the client reconnects to head 2 with the
last SSE id it saw: it gets exactly the rest of the reply, frame for frame."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import httpx
import pytest

from testkit.harness import ROOT, RunningServer, stop_processes

from .conftest import RedisServer
from .test_fleet_processes import MODEL, start_heads, start_worker

pytestmark = [pytest.mark.e2e, pytest.mark.model]

BODY = {"model": MODEL, "temperature": 0, "stream": True, "max_tokens": 48, "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}]}


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[RedisServer, list[RunningServer]]]:
    server = RedisServer().start()
    data_dir = tempfile.mkdtemp(prefix="superfluid-resume-")
    env = {**os.environ, "SUPERFLUID_DATA_DIR": data_dir}
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v", "0"], cwd=ROOT, env=env, check=True, timeout=300)
    worker = start_worker(server.url, data_dir, data_dir, 0)
    heads = [RunningServer("--redis", server.url, "--no-engine", env={"SUPERFLUID_DATA_DIR": data_dir}) for _ in range(2)]
    try:
        start_heads(heads)
        yield server, heads
    finally:
        for h in heads:
            if h.proc is not None and h.proc.poll() is None:
                h.stop()
        stop_processes(worker)
        server.stop()


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


def test_a_client_whose_head_died_gets_exactly_the_rest_from_another_head(fleet: tuple[RedisServer, list[RunningServer]]) -> None:
    _redis, (one, two) = fleet
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
        rest = [d for _, d in frames(r.iter_lines())]
    got = [d for _, d in seen] + rest
    # the same frames (the reply's id and created too), nothing repeated, nothing lost
    assert content(got) == content(reference)
    strip = [json.loads(d) | {"id": "", "created": 0} if d != "[DONE]" else d for d in got]
    assert strip == [json.loads(d) | {"id": "", "created": 0} if d != "[DONE]" else d for d in reference]
    assert len({json.loads(d)["id"] for d in got if d != "[DONE]"}) == 1

    # the stream is gone once answered; an id this server never sent is refused
    again = httpx.post(two.base + "/v1/chat/completions", json=BODY, headers={"last-event-id": last_id}, timeout=60)
    assert again.status_code == 404 and again.json()["error"]["code"] == "not_found"
    bad = httpx.post(two.base + "/v1/chat/completions", json=BODY, headers={"last-event-id": "nonsense"}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "Last-Event-ID"
