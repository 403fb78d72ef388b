"""A batch of ``/v1/embeddings`` requests, as OpenAI's Batch API runs them: the input file and
``POST /v1/batches`` take the endpoint, each line is validated and answered by the online route
itself (api/consumers.py's EmbeddingsConsumer, in this process against the simulated engine),
at the background class, and its result is in the output or the error file in OpenAI's shape."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from batches import runner
from tests.edge.inproc import JSON, MODEL, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)

BOUNDARY = "sf-s46-boundary"


def upload_body(data: bytes) -> bytes:
    return (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
            "Content-Type: application/jsonl\r\n\r\n").encode() + data + f"\r\n--{BOUNDARY}--\r\n".encode()


def line(custom_id: str, body: dict[str, Any]) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body}).encode() + b"\n"


def embedding_engine(link: Any) -> list[int]:
    """The simulated engine made to embed (it has none of its own): each vector is
    (tokens, 1.0); the token counts it was given come back in the list returned."""
    engine = link.worker.engine
    seen: list[int] = []
    engine.features = frozenset({"embeddings"})
    engine.embed = lambda tokens: seen.append(len(tokens)) or [float(len(tokens)), 1.0]
    return seen


async def test_an_embeddings_batch_runs_each_line_through_the_embeddings_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """``endpoint="/v1/embeddings"`` was refused (400 ``invalid_value``), and so was an input
    file with an embeddings line, though OpenAI's Batch API takes it and the ``openai`` client's
    embedding jobs are sent that way. Now each line is the online request: the output file holds
    the embeddings response objects, the lines the route refuses are in the error file with its
    error, and the counts match."""
    rows: list[dict[str, Any]] = []
    monkeypatch.setattr("activity.writer.submit", rows.append)
    started: list[str] = []

    async def start(batch_id: str) -> None:  # run below, in the test's own time
        started.append(batch_id)

    monkeypatch.setattr(runner, "start", start)
    data = b"".join([
        line("one", {"model": MODEL, "input": "the cat sat"}),
        line("many", {"model": MODEL, "input": ["a", [7, 7, 7]]}),
        line("b64", {"model": MODEL, "input": "xy", "encoding_format": "base64"}),
        line("no-input", {"model": MODEL}),
        line("dims", {"model": MODEL, "input": "x", "dimensions": 8}),
        line("no-model", {"model": "no-such-model", "input": "x"}),
    ])
    async with attached(SimWorker()) as (link, _rt):
        seen = embedding_engine(link)
        form = upload_body(data)
        up = await request("POST", "/v1/files", form, [(b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode()),
                                                       (b"content-length", str(len(form)).encode())])
        assert up.status == 200, up.body
        made = await request("POST", "/v1/batches", json.dumps({"input_file_id": up.json()["id"], "endpoint": "/v1/embeddings",
                                                                  "completion_window": "24h"}).encode(), JSON)
        assert made.status == 200, made.body
        assert (made.json()["endpoint"], made.json()["request_counts"]["total"]) == ("/v1/embeddings", 6)
        assert started == [made.json()["id"]]
        await asyncio.wait_for(runner.run_batch(started[0]), 60)
        shown = (await request("GET", f"/v1/batches/{started[0]}")).json()
        assert shown["status"] == "completed", shown
        assert shown["request_counts"] == {"total": 6, "completed": 3, "failed": 3}
        out = [json.loads(x) for x in (await request("GET", f"/v1/files/{shown['output_file_id']}/content")).body.decode().splitlines()]
        err = [json.loads(x) for x in (await request("GET", f"/v1/files/{shown['error_file_id']}/content")).body.decode().splitlines()]
    assert [o["custom_id"] for o in out] == ["one", "many", "b64"]
    for o in out:
        assert o["id"].startswith("batch_req_") and o["error"] is None
        assert o["response"]["status_code"] == 200 and o["response"]["request_id"]
        body = o["response"]["body"]
        assert (body["object"], body["model"]) == ("list", MODEL)
        assert all(d["object"] == "embedding" for d in body["data"])
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    assert [d["index"] for d in out[1]["response"]["body"]["data"]] == [0, 1]
    assert out[1]["response"]["body"]["data"][1]["embedding"] == [3.0, 1.0]  # the token ids as given: 3 of them
    assert isinstance(out[0]["response"]["body"]["data"][0]["embedding"], list)
    assert isinstance(out[2]["response"]["body"]["data"][0]["embedding"], str)  # base64, as asked
    assert len(seen) == 4  # one, two of many, b64: nothing embedded for a refused line
    assert [e["custom_id"] for e in err] == ["no-input", "dims", "no-model"]
    codes = [(e["response"]["status_code"], e["response"]["body"]["error"]["code"], e["response"]["body"]["error"]["param"]) for e in err]
    assert codes[0] == (400, "missing_required_parameter", "input")
    assert codes[1] == (400, "unsupported_parameter", "dimensions")
    assert codes[2][0] == 404 and codes[2][2] == "model", codes
    assert all(e["error"] is None for e in err)  # the request ran and was answered: the answer is its response
    ran = [r for r in rows if r["endpoint"] == "embeddings"]
    assert len(ran) == 6, [(r["endpoint"], r["status"]) for r in rows]
    assert {r["qos_class"] for r in ran if r["status"] == 200} == {"background"}  # as every batch line
