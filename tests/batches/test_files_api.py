"""The Files API as OpenAI's clients use it: listing by purpose with a page size and a cursor,
and deleting a file (an input file only once no running batch needs it)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from batches.models import Batch, File, Line

pytestmark = pytest.mark.django_db(transaction=True)


def upload(client: Client, name: str) -> str:
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "p"}}
    from django.core.files.uploadedfile import SimpleUploadedFile

    r = client.post("/v1/files", {"purpose": "batch", "file": SimpleUploadedFile(name, json.dumps(line).encode())})
    assert r.status_code == 200, r.content
    return str(r.json()["id"])


def test_the_list_honours_purpose_limit_and_after() -> None:
    client = Client()
    ids = [upload(client, f"f{i}.jsonl") for i in range(3)]  # newest last
    File.objects.create(purpose="batch_output", filename="out.jsonl", bytes=0, content=b"", owner="")
    assert [f["purpose"] for f in client.get("/v1/files?purpose=batch").json()["data"]] == ["batch"] * 3
    page = client.get("/v1/files?purpose=batch&limit=2").json()
    assert [f["id"] for f in page["data"]] == ids[::-1][:2] and page["has_more"] is True
    rest = client.get(f"/v1/files?purpose=batch&limit=2&after={ids[1]}").json()
    assert [f["id"] for f in rest["data"]] == [ids[0]] and rest["has_more"] is False
    assert [f["id"] for f in client.get("/v1/files?purpose=batch&order=asc").json()["data"]] == ids
    for bad in ("limit=0", "limit=10001", "limit=x", "order=up", "after=file-nope"):
        r = client.get(f"/v1/files?{bad}")
        assert r.status_code == 400 and r.json()["error"]["param"] == bad.split("=")[0], bad


def test_a_file_is_deleted_once_no_running_batch_needs_it() -> None:
    client = Client()
    fid = upload(client, "in.jsonl")
    r = client.post("/v1/batches", {"input_file_id": fid, "endpoint": "/v1/completions", "completion_window": "24h"}, content_type="application/json")
    assert r.status_code == 200, r.content
    batch_id = r.json()["id"]
    busy = client.delete(f"/v1/files/{fid}")  # validating or in progress: its lines are read from it
    assert busy.status_code == 400 and busy.json()["error"]["code"] == "file_in_use"
    out = File.objects.create(purpose="batch_output", filename="out.jsonl", bytes=0, content=b"", owner="")
    Batch.objects.filter(pk=batch_id).update(status="completed", output_file=out)  # it ended
    gone = client.delete(f"/v1/files/{fid}")
    assert gone.status_code == 200 and gone.json() == {"id": fid, "object": "file", "deleted": True}
    assert client.get(f"/v1/files/{fid}").status_code == 404
    done = client.get(f"/v1/batches/{batch_id}").json()
    assert done["status"] == "completed" and done["input_file_id"] is None and Line.objects.filter(batch_id=batch_id).count() == 1
    assert client.delete(f"/v1/files/{done['output_file_id']}").status_code == 200
    assert Batch.objects.get(pk=batch_id).output_file is None
    assert client.delete("/v1/files/file-nope").status_code == 404


def test_a_batch_refused_for_a_line_of_another_endpoint_names_its_line_in_the_file() -> None:
    """The error counted requests, not lines: with a blank line before it, the third line of
    the file was called "Request 2", which is no line an editor shows."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    client = Client()
    ok = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "p"}}
    other = {"custom_id": "b", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": []}}
    data = (json.dumps(ok) + "\n\n" + json.dumps(other) + "\n").encode()
    r = client.post("/v1/files", {"purpose": "batch", "file": SimpleUploadedFile("mixed.jsonl", data)})
    assert r.status_code == 200, r.content
    r = client.post("/v1/batches", json.dumps({"input_file_id": r.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"}),
                    content_type="application/json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_file"
    assert r.json()["error"]["message"].startswith("Line 3 of the input file (custom_id 'b')"), r.json()
    assert Batch.objects.count() == 0
