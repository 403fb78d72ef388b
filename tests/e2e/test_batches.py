"""The Batch API against the real server and model, through the unmodified ``openai`` client
(the embedded mode: lines run in the web process, at the background class). A batch that goes
on after serve restarts is tests/e2e/test_worker_faults.py's drain test."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from .server import RunningServer, openai_client

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"


def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server.base)


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def chat_line(i: int, max_tokens: int = 8) -> dict:
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"Count to {i}."}], "max_tokens": max_tokens, "temperature": 0}}


def wait_for(c: openai.OpenAI, batch_id: str, states: tuple[str, ...], timeout_s: float = 300):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        b = c.batches.retrieve(batch_id)
        if b.status in states or time.monotonic() > deadline:
            return b
        time.sleep(0.5)


def test_a_20_line_batch_completes_with_20_outputs(server: RunningServer) -> None:
    c = client(server)
    lines = [chat_line(i) for i in range(20)]
    lines[7]["body"]["model"] = "no-such-model"  # one line fails; the batch still completes
    f = c.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    assert f.purpose == "batch" and f.bytes > 0
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"job": "nightly"})
    assert b.status in ("validating", "in_progress") and b.request_counts.total == 20
    b = wait_for(c, b.id, ("completed", "failed", "cancelled"))
    assert b.status == "completed", b
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (20, 19, 1)
    assert b.metadata == {"job": "nightly"} and b.completed_at and b.in_progress_at and b.finalizing_at
    out = [json.loads(x) for x in c.files.content(b.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in out) == sorted(f"req-{i}" for i in range(20) if i != 7)
    for o in out:
        assert o["error"] is None and o["response"]["status_code"] == 200 and o["response"]["request_id"]
        assert o["response"]["body"]["object"] == "chat.completion"
        assert o["response"]["body"]["choices"][0]["message"]["content"]
    errors = [json.loads(x) for x in c.files.content(b.error_file_id).text.splitlines()]
    assert [e["custom_id"] for e in errors] == ["req-7"]
    assert errors[0]["response"]["status_code"] == 404 and errors[0]["response"]["body"]["error"]["code"] == "model_not_found"
    assert b.id in [x.id for x in c.batches.list()]


def test_an_embeddings_batch_gives_the_vectors_the_online_route_gives(server: RunningServer) -> None:
    """``endpoint="/v1/embeddings"``, as the ``openai`` client's embedding jobs send it: each
    output line's ``response.body`` is the embeddings response object, the same vectors as
    ``client.embeddings.create`` gives; a line the route refuses is in the error file."""
    c = client(server)
    texts = ["The cat sat on the mat.", "Quarterly revenue grew by ten percent."]
    lines = [{"custom_id": f"emb-{i}", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": t, "encoding_format": "float"}}
             for i, t in enumerate(texts)]
    lines.append({"custom_id": "emb-bad", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL}})
    f = c.files.create(file=("emb.jsonl", jsonl(lines)), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    b = wait_for(c, b.id, ("completed", "failed", "cancelled", "expired"))
    assert b.status == "completed", b
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (3, 2, 1)
    out = [json.loads(x) for x in c.files.content(b.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in out] == ["emb-0", "emb-1"]
    online = c.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    for o, want in zip(out, online.data, strict=True):
        body = o["response"]["body"]
        assert o["response"]["status_code"] == 200 and (body["object"], body["model"]) == ("list", MODEL)
        assert body["data"][0]["embedding"] == pytest.approx(want.embedding, abs=1e-6)
    errors = [json.loads(x) for x in c.files.content(b.error_file_id).text.splitlines()]
    assert [e["custom_id"] for e in errors] == ["emb-bad"]
    assert (errors[0]["response"]["status_code"], errors[0]["response"]["body"]["error"]["param"]) == (400, "input")


def test_cancel_stops_a_running_batch(server: RunningServer) -> None:
    c = client(server)
    lines = [chat_line(i, max_tokens=200) for i in range(40)]
    f = c.files.create(file=("long.jsonl", jsonl(lines)), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 120
    while c.batches.retrieve(b.id).status != "in_progress" and time.monotonic() < deadline:
        time.sleep(0.1)
    # its lines hold lanes at the background class
    classes: set[str] = set()
    while not classes and time.monotonic() < deadline:
        classes = {lane["class"] for lane in server.state().get("lanes", []) if lane["state"] != "idle"}
        time.sleep(0.05)
    assert classes == {"background"}
    cancelled = c.batches.cancel(b.id)
    assert cancelled.status in ("cancelling", "cancelled")
    b = wait_for(c, b.id, ("cancelled", "completed", "failed"), timeout_s=60)
    assert b.status == "cancelled" and b.cancelled_at
    assert b.request_counts.completed + b.request_counts.failed < 40
    # nothing of the batch is left on the lanes
    deadline = time.monotonic() + 30
    while any(lane["state"] != "idle" for lane in server.state().get("lanes", [])) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all(lane["state"] == "idle" for lane in server.state().get("lanes", []))
    # a cancelled batch stays cancelled; cancelling again is refused, as OpenAI refuses it (409)
    with pytest.raises(openai.ConflictError, match="Cannot cancel a batch with status 'cancelled'"):
        c.batches.cancel(b.id)
    assert c.batches.retrieve(b.id).status == "cancelled"


def test_bad_input_is_refused_and_stores_nothing(server: RunningServer) -> None:
    c = client(server)
    before = len(httpx.get(server.base + "/v1/files", timeout=10).json()["data"])
    bad = [
        b"not json\n",
        jsonl([{"custom_id": "a", "method": "GET", "url": "/v1/chat/completions", "body": {}}]),
        jsonl([{"custom_id": "a", "method": "POST", "url": "/v1/moderations", "body": {}}]),
        jsonl([chat_line(1), chat_line(1)]),
        jsonl([{**chat_line(1), "body": {"model": MODEL, "messages": [], "stream": True}}]),
        b"",
    ]
    for data in bad:
        with pytest.raises(openai.BadRequestError) as err:
            c.files.create(file=("bad.jsonl", data), purpose="batch")
        assert err.value.code == "invalid_file", data
    with pytest.raises(openai.BadRequestError) as err:
        c.files.create(file=("x.jsonl", jsonl([chat_line(1)])), purpose="fine-tune")
    assert err.value.param == "purpose"
    # over the bound (--max-body-bytes, 8 MiB): 413 before the server reads it all
    big = jsonl([chat_line(1)]) + b" " * (9 * 1024 * 1024)
    with pytest.raises(openai.APIStatusError) as err:
        c.files.create(file=("big.jsonl", big), purpose="batch")
    assert err.value.status_code == 413 and err.value.code == "request_too_large"
    r = httpx.post(server.base + "/v1/files", content=b"--x\r\ngarbage", headers={"content-type": "multipart/form-data; boundary=x"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert len(httpx.get(server.base + "/v1/files", timeout=10).json()["data"]) == before
    # a file for one endpoint cannot start a batch on the other
    f = c.files.create(file=("ok.jsonl", jsonl([chat_line(1)])), purpose="batch")
    with pytest.raises(openai.BadRequestError) as err:
        c.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h")
    assert err.value.param == "input_file_id"
    with pytest.raises(openai.NotFoundError):
        c.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        c.batches.retrieve("batch_nope")
    assert c.batches.list().data == [] or all(x.input_file_id != f.id for x in c.batches.list())
