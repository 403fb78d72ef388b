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
    # the batch still names its deleted file, as OpenAI's does (a required string in its Batch
    # object: a strictly typed client failed to read the null it was here)
    assert done["status"] == "completed" and done["input_file_id"] == fid and Line.objects.filter(batch_id=batch_id).count() == 1
    assert client.delete(f"/v1/files/{done['output_file_id']}").status_code == 200
    again = client.get(f"/v1/batches/{batch_id}").json()
    assert again["input_file_id"] == fid and again["output_file_id"] == out.id
    assert client.get(f"/v1/files/{out.id}").status_code == 404 and client.get(f"/v1/files/{out.id}/content").status_code == 404
    listed = client.get("/v1/batches").json()["data"]
    assert [(b["id"], b["input_file_id"]) for b in listed] == [(batch_id, fid)]
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


def make_batches(n: int) -> list[str]:
    f = File.objects.create(purpose="batch", filename="in.jsonl", bytes=1, content=b"x", owner="")
    return [Batch.objects.create(endpoint="/v1/completions", input_file=f, owner="", status="completed").id for _ in range(n)]


def test_the_batch_list_pages_through_batches_created_in_one_clock_tick_each_once() -> None:
    """Batches of one creation time (a coarse clock, a burst of creates) were ordered by time
    only, and the page after one of them started from its whole tick again: the client's
    auto-paging (after=last_id) went round the same ones for ever."""
    from django.utils import timezone

    client = Client()
    ids = make_batches(5)
    Batch.objects.update(created_at=timezone.now())
    seen: list[str] = []
    after = ""
    for _ in range(10):  # 5 pages of 1, then the end
        page = client.get("/v1/batches?limit=1" + (f"&after={after}" if after else "")).json()
        seen += [b["id"] for b in page["data"]]
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert sorted(seen) == sorted(ids) and len(seen) == 5
    assert [b["id"] for b in client.get("/v1/batches?limit=2").json()["data"]] == seen[:2]  # one order, every time


def test_the_batch_list_refuses_a_limit_outside_1_to_100_as_the_files_list_does() -> None:
    """OpenAI's batch list takes a limit of 1 to 100; 0, a negative or 101 were read as 1 or
    100 (a page the client did not ask for, with no word of it) where the files list says 400."""
    client = Client()
    make_batches(3)
    for bad in ("0", "-1", "101", "100000", "x", ""):
        r = client.get(f"/v1/batches?limit={bad}")
        assert r.status_code == 400, (bad, r.content)
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "limit", (bad, error)
    assert len(client.get("/v1/batches?limit=1").json()["data"]) == 1
    assert len(client.get("/v1/batches?limit=100").json()["data"]) == 3
    assert len(client.get("/v1/batches").json()["data"]) == 3  # 20 by default


def test_the_batch_list_refuses_an_unknown_cursor_and_head_is_the_list() -> None:
    """An ``after`` naming no batch of the caller's gave the first page again (a loop for a
    client paging by it), where the files list says 400; HEAD /v1/batches was read as a create
    (400 missing input_file_id)."""
    client = Client()
    make_batches(1)
    r = client.get("/v1/batches?after=batch_nope")
    assert r.status_code == 400 and r.json()["error"]["param"] == "after"
    assert client.head("/v1/batches").status_code == 200
    assert Batch.objects.count() == 1


def test_the_batch_list_pages_on_after_a_batch_deleted_meanwhile() -> None:
    """A client paging by ``after=<last id of its page>`` while an operator deleted that batch in
    the admin got a 400 (no such batch) instead of the next page. As a file's (the file list's
    test above), a batch's id names its creation time: the page after it is found without its
    row; an old id of 24 random digits names none and still needs its row."""
    from batches.models import batch_time

    client = Client()
    ids = make_batches(5)  # newest last
    assert all(Batch.objects.get(pk=i).created_at == batch_time(i) for i in ids)
    page = client.get("/v1/batches?limit=2").json()
    seen = [b["id"] for b in page["data"]]
    Batch.objects.filter(pk=page["last_id"]).delete()  # the admin's delete, meanwhile
    while page["has_more"]:
        r = client.get(f"/v1/batches?limit=2&after={page['last_id']}")
        assert r.status_code == 200, r.content
        page = r.json()
        seen += [b["id"] for b in page["data"]]
    assert seen == ids[::-1], seen  # each batch once, none skipped
    assert batch_time("batch_" + "f" * 24) is None
    assert client.get("/v1/batches?after=batch_" + "f" * 24).status_code == 400


def test_any_file_the_upload_takes_makes_a_batch_whose_lines_load() -> None:
    """Nesting was bounded only by Python's parser, whose limit counts the frames it is called
    under: a line nested as deep as the upload could read was "not valid JSON" when the batch
    was created from it (or, read back deeper in a runner's stack, could never be claimed)."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    client = Client()

    def data(depth: int) -> bytes:  # the line itself is one level, its body two
        inner = "[" * (depth - 2) + "]" * (depth - 2)
        return ('{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "p", "x": ' + inner + "}}").encode()

    def accepted(depth: int) -> str | None:
        r = client.post("/v1/files", {"purpose": "batch", "file": SimpleUploadedFile("deep.jsonl", data(depth))})
        assert r.status_code in (200, 400), r.content
        return str(r.json()["id"]) if r.status_code == 200 else None

    low, high = 3, 2000  # the deepest line the upload takes: accepted(low), not accepted(high)
    assert accepted(low) and not accepted(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if accepted(mid) else (low, mid)
    fid = accepted(low)
    r = client.post("/v1/batches", json.dumps({"input_file_id": fid, "endpoint": "/v1/completions", "completion_window": "24h"}),
                    content_type="application/json")
    assert r.status_code == 200, r.content
    assert Line.objects.get(batch_id=r.json()["id"]).body == json.loads(data(low))["body"]


def test_a_file_deleted_while_a_batch_is_created_from_it_is_not_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another head's DELETE while the file's lines were read: the batch's insert failed on its
    foreign key at commit, a 500."""
    from batches import views

    client = Client(raise_request_exception=False)
    fid = upload(client, "in.jsonl")
    read = views.parse_jsonl

    def deleted_meanwhile(data: bytes, max_lines: int) -> object:
        File.objects.filter(pk=fid).delete()
        return read(data, max_lines)

    monkeypatch.setattr(views, "parse_jsonl", deleted_meanwhile)
    r = client.post("/v1/batches", json.dumps({"input_file_id": fid, "endpoint": "/v1/completions", "completion_window": "24h"}),
                    content_type="application/json")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.content
    assert Batch.objects.count() == 0


def test_a_batch_of_an_output_file_is_refused_for_its_purpose_not_as_missing() -> None:
    """The caller's own output file (listed by GET /v1/files) was "No such file", a 404."""
    client = Client()
    out = File.objects.create(purpose="batch_output", filename="out.jsonl", bytes=1, content=b"{}\n", owner="")
    r = client.post("/v1/batches", json.dumps({"input_file_id": out.id, "endpoint": "/v1/completions", "completion_window": "24h"}),
                    content_type="application/json")
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_file_id" and "purpose" in r.json()["error"]["message"], r.content
    theirs = File.objects.create(purpose="batch_output", filename="out.jsonl", bytes=1, content=b"{}\n", owner="other")
    r = client.post("/v1/batches", json.dumps({"input_file_id": theirs.id, "endpoint": "/v1/completions", "completion_window": "24h"}),
                    content_type="application/json")
    assert r.status_code == 404  # another key's file: not found, purpose or not
    assert Batch.objects.count() == 0


def test_an_upload_is_read_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The upload's lines were parsed in the async view itself: a large file (8 MiB takes a good
    part of a second) held up every stream the head was sending meanwhile."""
    import asyncio

    from batches import views

    read = views.parse_jsonl
    on_loop: list[bool] = []

    def parse(data: bytes, max_lines: int) -> object:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return read(data, max_lines)

    monkeypatch.setattr(views, "parse_jsonl", parse)
    upload(Client(), "in.jsonl")
    assert on_loop == [False]


def test_the_file_list_names_its_first_and_last_id_as_openais_list_does() -> None:
    """OpenAI's list of files carries ``first_id`` and ``last_id`` beside ``has_more`` (required in
    its spec's ListFilesResponse; a client generated from it, or one paging by ``last_id`` as on
    the batch list here, failed on a list without them)."""
    client = Client()
    ids = [upload(client, f"f{i}.jsonl") for i in range(3)]  # newest last
    page = client.get("/v1/files?limit=2").json()
    assert (page["first_id"], page["last_id"], page["has_more"]) == (ids[2], ids[1], True)
    rest = client.get(f"/v1/files?limit=2&after={page['last_id']}").json()
    assert (rest["first_id"], rest["last_id"], rest["has_more"]) == (ids[0], ids[0], False)
    empty = client.get("/v1/files?purpose=batch_output").json()
    assert empty == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


def test_the_file_list_pages_on_after_a_file_deleted_meanwhile() -> None:
    """A client paging by ``after=<last id of its page>`` while another client deleted that
    file got a 400 (no such file) instead of the next page: the cursor named a row that was
    gone. OpenAI's cursor stays usable; here a file's id names its creation time, so the page
    after it is found without its row, in either order."""
    client = Client()
    ids = [upload(client, f"f{i}.jsonl") for i in range(5)]  # newest last
    for order, expected in (("desc", ids[::-1]), ("asc", ids)):
        seen: list[str] = []
        page = client.get(f"/v1/files?limit=2&order={order}").json()
        seen += [f["id"] for f in page["data"]]
        deleted = page["last_id"]
        assert client.delete(f"/v1/files/{deleted}").status_code == 200  # another client, meanwhile
        while page["has_more"]:
            r = client.get(f"/v1/files?limit=2&order={order}&after={page['last_id']}")
            assert r.status_code == 200, r.content
            page = r.json()
            seen += [f["id"] for f in page["data"]]
        assert seen == [i for i in expected if i in ids], (order, seen)  # each file once, none skipped
        ids.remove(deleted)
    assert client.get("/v1/files?after=file-nope").status_code == 400  # no file's id: still refused


def test_files_made_before_timed_ids_still_page_and_a_new_files_time_is_its_ids() -> None:
    """Ids of 24 random hex digits (files made before ids named their time) stay cursors while
    their file exists; a new file's created_at is the time its id names, to the microsecond."""
    from datetime import timedelta

    from django.utils import timezone

    from batches.models import file_time

    client = Client()
    old = File.objects.create(id="file-" + "f" * 24, purpose="batch", filename="old.jsonl", bytes=1, content=b"x", owner="")
    File.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=1))
    new = upload(client, "new.jsonl")
    assert file_time(old.id) is None and File.objects.get(pk=new).created_at == file_time(new)
    assert [f["id"] for f in client.get(f"/v1/files?order=asc&after={old.id}").json()["data"]] == [new]
    assert [f["id"] for f in client.get(f"/v1/files?after={new}").json()["data"]] == [old.id]
    assert client.get(f"/v1/files/{old.id}").json()["id"] == old.id
    File.objects.filter(pk=old.pk).delete()
    assert client.get(f"/v1/files?after={old.id}").status_code == 400  # its place is known nowhere


def test_a_files_metadata_and_its_delete_do_not_read_its_content() -> None:
    """GET /v1/files/{id} (and HEAD, DELETE) read the file's whole content from the database to
    answer with its size and name: an output file of a large batch (hundreds of MiB) was read
    and held whole for each look at it, as the list avoids (it defers the content)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = Client()
    fid = upload(client, "in.jsonl")
    content = f"{connection.ops.quote_name(File._meta.db_table)}.{connection.ops.quote_name('content')}"
    for method in ("get", "head", "delete"):
        with CaptureQueriesContext(connection) as queries:
            r = getattr(client, method)(f"/v1/files/{fid}")
        assert r.status_code == 200, (method, r.content)
        read = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT") and content in q["sql"]]
        assert read == [], (method, read)
    assert not File.objects.filter(pk=fid).exists()


def test_a_batch_creations_body_is_parsed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """POST /v1/batches parsed its JSON (up to Django's 2.5 MiB) in the async view itself, on
    the event loop that every stream of the head runs on."""
    import asyncio

    from batches import views

    parse = views._json
    on_loop: list[bool] = []

    def recording(request: object) -> dict[str, object]:
        try:
            asyncio.get_running_loop()
            on_loop.append(True)
        except RuntimeError:
            on_loop.append(False)
        return parse(request)  # type: ignore[arg-type]

    monkeypatch.setattr(views, "_json", recording)
    client = Client()
    file_id = upload(client, "in.jsonl")
    r = client.post("/v1/batches", {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}, content_type="application/json")
    assert r.status_code == 200, r.content
    assert on_loop == [False]


def test_a_batch_body_is_read_as_every_api_body_is() -> None:
    """POST /v1/batches parsed its body with json.loads of its own: a UTF-16 body (which no
    other route takes) made a batch, and NaN or 1e999 in it passed as numbers. One parser
    for every body: those are 400 invalid_json; a UTF-8 byte-order mark is skipped."""
    client = Client()
    fid = upload(client, "a.jsonl")
    body = {"input_file_id": fid, "endpoint": "/v1/completions", "completion_window": "24h"}
    for raw in (json.dumps(body).encode("utf-16"), json.dumps({**body, "metadata": {"x": "y"}, "n": float("nan")}).encode()):
        r = client.post("/v1/batches", raw, content_type="application/json")
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json", r.content
    assert not Batch.objects.exists()
    r = client.post("/v1/batches", b"\xef\xbb\xbf" + json.dumps(body).encode(), content_type="application/json")
    assert r.status_code == 200, r.content
