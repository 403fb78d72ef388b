"""One real server whose engine worker dies, three ways, while the web process stays up.

- At start-up: SUPERFLUID_TEST_CRASH_PROBE=repack makes the worker SIGSEGV itself in its
  start-up decode while llama.cpp's extra buffer types are on (issue 17's crash, made for real);
  serve starts it once more with --no-repack and comes up (the supervisor's other rules are
  tests/e2e/test_startup_crash.py's).
- SIGKILL during one stream: the server stays up and serves the next request.
- SIGKILL with eight chat streams in flight (local link, no Redis): every stream either
  completes with exactly the text of an undisturbed greedy run or ends with a clear error frame
  and ``[DONE]``; none hangs, none repeats or loses text.

Then SIGTERM: the drain lets what fits finish, refuses new work, ends what outlasts
--drain-timeout with an error frame, and serve exits 0; a batch it was running goes on when
serve starts again on the same database."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from scheduler.management.commands.runengine import CRASH_PROBE_ENV

from .server import RunningServer, openai_client
from .test_batches import chat_line, jsonl, wait_for
from .test_startup_crash import RETRY_LINE

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"
N = 8
# batch-invariant lanes: a greedy text does not depend on what else shares the batch, so an
# undisturbed run of the eight is a fair reference for a disturbed one, whatever the worker
# restarted with
INVARIANT = {"x-superfluid-batch-invariant": "1"}
BATCH_LINES = 24


def chat(base: str, name: str, out: dict[str, dict[str, Any]], progress: dict[str, int] | None = None) -> None:
    """Stream one greedy chat; out[name] = {"text", "error" (the error frame's object or None),
    "done" ([DONE] seen)}."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"Tell story number {name}."}], "max_tokens": 32, "temperature": 0, "stream": True}
    result: dict[str, Any] = {"text": "", "error": None, "done": False}
    parts: list[str] = []
    try:
        with httpx.stream("POST", base + "/v1/chat/completions", json=body, headers=INVARIANT, timeout=300) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    result["done"] = True
                    break
                event = json.loads(line[6:])
                if "error" in event:
                    result["error"] = event["error"]
                    continue
                for choice in event.get("choices", []):
                    piece = (choice.get("delta") or {}).get("content") or ""
                    if piece:
                        parts.append(piece)
                        if progress is not None:
                            progress[name] = len(parts)
    finally:
        result["text"] = "".join(parts)
        out[name] = result


@pytest.fixture(scope="module")
def srv() -> Iterator[RunningServer]:
    """One server whose worker crashes at start-up and is then killed twice (the web process
    outlives each), then drained (the module's last test)."""
    server = RunningServer(
        "--max-batch", "8", "--ctx-size", "2048", "--http-allow-batch-invariant", "--drain-timeout", "8", env={CRASH_PROBE_ENV: "repack"}
    ).start(timeout_s=240)  # fmt: skip
    try:
        yield server
    finally:
        server.stop()


def test_serve_comes_up_with_no_repack_when_the_start_up_decode_crashes_with_extra_buffer_types(srv: RunningServer) -> None:
    # first in the module: the kills below restart the worker, and their lines join the log
    r = httpx.post(
        srv.base + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    log = srv.log()
    assert log.count(RETRY_LINE) == 1 and "SIGSEGV" in log
    assert "restarting" not in log and srv.health()["worker_restarts"] == 0


def test_killed_worker_does_not_take_the_server_down_and_streams_continue(srv: RunningServer) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 120, "temperature": 0, "stream": True}
    restarts = srv.health()["worker_restarts"]
    texts: list[str] = []
    done = False
    with httpx.stream("POST", srv.base + "/v1/completions", json=body, timeout=120) as r:
        killed = False
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            assert "error" not in event, event
            texts.append(event["choices"][0]["text"])
            if len(texts) == 5 and not killed:
                os.kill(int(srv.health()["worker_pid"]), signal.SIGKILL)
                killed = True
    # the stream went on past the kill (its job resumed on the new worker) and ended properly
    assert killed and done and len(texts) > 5, (done, texts)
    assert srv.proc is not None and srv.proc.poll() is None  # the web server is still up
    assert srv.health()["worker_restarts"] >= restarts + 1
    c = openai_client(srv.base)
    again = c.completions.create(model=MODEL, prompt="Hello", max_tokens=5)
    assert again.choices[0].text


def test_sigkill_of_the_worker_with_eight_chat_streams_in_flight_loses_repeats_and_hangs_nothing(srv: RunningServer) -> None:
    names = [str(i) for i in range(N)]
    reference: dict[str, dict[str, Any]] = {}
    undisturbed = [threading.Thread(target=chat, args=(srv.base, name, reference)) for name in names]
    for t in undisturbed:
        t.start()
    for t in undisturbed:
        t.join()
    assert all(r["done"] and r["error"] is None and r["text"] for r in reference.values()), reference

    results: dict[str, dict[str, Any]] = {}
    progress: dict[str, int] = {}
    threads = [threading.Thread(target=chat, args=(srv.base, name, results, progress)) for name in names]
    for t in threads:
        t.start()
    # every stream past its opening pieces (text resumed right after them can tokenise
    # differently from what the model produced: a limit of resuming from text)
    srv.wait_for(lambda: len(progress) == N and min(progress.values()) >= 6, timeout_s=300)
    pid = int(srv.health()["worker_pid"])
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(timeout=300)  # httpx's own timeout ends a hung stream first; this is the failsafe
    assert not any(t.is_alive() for t in threads), "a stream hung"

    assert sorted(results) == names
    for name, r in results.items():
        assert r["done"], (name, r)  # every stream ended properly: [DONE], never a cut connection
        if r["error"] is None:
            assert r["text"] == reference[name]["text"], name  # nothing lost, nothing repeated
        else:  # a clear error, and what came before it is the reference's beginning
            assert r["error"]["message"] and r["error"]["type"], r
            assert reference[name]["text"].startswith(r["text"]), name
    assert any(r["error"] is None for r in results.values())  # the jobs were resumed, not all failed
    assert srv.health()["worker_restarts"] >= 1 and srv.health()["worker_pid"] != pid
    srv.wait_for(lambda: srv.state().get("lanes_active", 0) == 0, timeout_s=60)


def _collect(srv: RunningServer, body: dict, lines: list[str], started: threading.Event, after: int) -> None:
    """Stream ``body``, keeping every ``data:`` line; ``started`` is set after ``after`` lines."""
    with httpx.stream("POST", srv.base + "/v1/completions", json=body, timeout=120) as r:
        lines.append(r.headers["x-request-id"])
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line)
                if len(lines) == after + 1:
                    started.set()
    started.set()


def test_sigterm_drains_what_fits_and_exits_zero_and_the_batch_it_was_running_goes_on_after_a_restart(srv: RunningServer) -> None:
    """Last in the module: it stops the server. Both halves of a drain: a short stream in flight
    at SIGTERM finishes normally; a long one (2,000 tokens, far beyond --drain-timeout) ends with
    an error frame; a new request meanwhile is a 503; serve exits 0. (Free lanes keep the probe
    requests sent before the signal is handled from queueing behind the two streams.) A batch
    running in the web process meanwhile is cut short, not failed: serve started again on the
    same database finishes it, each line once."""
    c = openai_client(srv.base)
    # six rounds of the runner's 4 claimers, 48 tokens a line: far from done when the signal
    # comes, a second after the first line and the two streams have started
    f = c.files.create(file=("in.jsonl", jsonl([chat_line(i, max_tokens=48) for i in range(BATCH_LINES)])), purpose="batch")
    batch = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    srv.wait_for(lambda: c.batches.retrieve(batch.id).request_counts.completed >= 1, timeout_s=120)
    short = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "stream": True}
    long = {"model": MODEL, "prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 2000, "temperature": 0, "stream": True}
    got: dict[str, list[str]] = {"short": [], "long": []}
    started = {name: threading.Event() for name in got}
    threads = [
        threading.Thread(target=_collect, args=(srv, short, got["short"], started["short"], 1)),
        threading.Thread(target=_collect, args=(srv, long, got["long"], started["long"], 5)),
    ]
    try:
        for t in threads:
            t.start()
        assert all(e.wait(120) for e in started.values())
        assert srv.proc is not None
        srv.proc.send_signal(signal.SIGTERM)
        # once the signal is handled, a new request is refused while the streams drain
        probe = {**short, "stream": False, "max_tokens": 1}
        refused = srv.wait_for(lambda: (r := httpx.post(srv.base + "/v1/completions", json=probe, timeout=30)).status_code == 503 and r, timeout_s=30)
        assert refused.json()["error"]["code"], refused.text
        for t in threads:
            t.join(120)
        # the wait's bound is a failsafe, not a measure
        assert srv.proc.wait(timeout=120) == 0

        request_id, *lines = got["short"]
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"

        request_id, *lines = got["long"]
        assert lines[-1] == "data: [DONE]"
        error = json.loads(lines[-2][6:])["error"]
        assert error["code"] == "engine_unavailable" and "shut down" in error["message"]
        assert all("choices" in json.loads(line[6:]) for line in lines[:-2])  # text, then the error
        # the long stream's access line (the kills before this test ended streams with errors too)
        line = next(x for x in srv.log().splitlines() if f"completions {request_id} status=200" in x)
        assert "error=engine_unavailable" in line, line
        with sqlite3.connect(Path(srv.data_dir) / "superfluid.sqlite3") as db:
            rows = db.execute("SELECT error_code FROM activity_activityentry WHERE request_id = ?", (request_id,)).fetchall()
        assert rows == [("engine_unavailable",)]
    finally:
        srv.stop()
        for t in threads:
            t.join(30)
    again = RunningServer("--max-batch", "4", "--ctx-size", "1024", env={"SUPERFLUID_DATA_DIR": srv.data_dir}).start()
    try:
        c = openai_client(again.base)
        cut = c.batches.retrieve(batch.id)
        assert cut.status == "in_progress" and cut.request_counts.completed < BATCH_LINES, cut  # it was cut short
        done = wait_for(c, batch.id, ("completed", "failed", "cancelled"))
        assert done.status == "completed" and (done.request_counts.completed, done.request_counts.failed) == (BATCH_LINES, 0), done
        out = [json.loads(x)["custom_id"] for x in c.files.content(done.output_file_id).text.splitlines()]
        assert out == [f"req-{i}" for i in range(BATCH_LINES)]  # each line once, in input order
    finally:
        again.stop()
