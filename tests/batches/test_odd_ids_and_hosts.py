"""Ids, cursors and Hosts that SQLite stores and PostgreSQL refuses: each a 404 or 400 (or a
batch created), never a 500. Run on PostgreSQL with DATABASE_URL, as tests/site/test_postgresql.py
runs its listed files; on SQLite they pass before and after the fix."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client, override_settings

from batches.models import Batch, File

pytestmark = pytest.mark.django_db(transaction=True)

LINE = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "p"}}


def test_an_id_or_cursor_holding_u0000_is_not_found_not_a_server_error() -> None:
    """PostgreSQL refuses U+0000 in a text parameter: ``GET /v1/batches/batch_%00`` (a file's,
    its content, a cancel, a delete, a list's ``after`` or ``purpose``, a create's
    ``input_file_id``) was a 500 there; a 404 or 400 on SQLite."""
    client = Client(raise_request_exception=False)
    File.objects.create(purpose="batch", filename="in.jsonl", bytes=1, content=b"x", owner="")
    for method, path, status in (("get", "/v1/batches/batch_%00", 404), ("post", "/v1/batches/batch_%00/cancel", 404),
                                 ("get", "/v1/files/file-%00", 404), ("get", "/v1/files/file-%00/content", 404),
                                 ("delete", "/v1/files/file-%00", 404), ("get", "/v1/batches?after=batch_%00", 400),
                                 ("get", "/v1/files?after=file-%00", 400)):
        r = getattr(client, method)(path)
        assert r.status_code == status, (method, path, r.content)
        assert r.json()["error"]["type"] == "invalid_request_error", (path, r.content)
    r = client.get("/v1/files?purpose=batch%00")
    assert r.status_code == 200 and r.json()["data"] == [], r.content  # no file has that purpose
    r = client.post("/v1/batches", json.dumps({"input_file_id": "file-\u0000", "endpoint": "/v1/completions", "completion_window": "24h"}),
                    content_type="application/json")
    assert r.status_code == 404 and r.json()["error"]["param"] == "id", r.content
    assert Batch.objects.count() == 0


def test_a_batch_created_under_the_longest_dns_name_with_a_port_is_created() -> None:
    """The batch keeps the Host it was created under (its lines are sent with it) in a column of
    255 characters: a DNS name may have 253, and with its port (``:8443``) the create was a 500
    on PostgreSQL (value too long). The lines' Host check ignores the port: the name is kept."""
    name = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 49, "example.com"])
    assert len(name) == 253
    with override_settings(ALLOWED_HOSTS=[".example.com"]):
        client = Client(raise_request_exception=False, HTTP_HOST=f"{name}:8443")
        r = client.post("/v1/files", {"purpose": "batch", "file": SimpleUploadedFile("in.jsonl", json.dumps(LINE).encode())})
        assert r.status_code == 200, r.content
        r = client.post("/v1/batches", json.dumps({"input_file_id": r.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"}),
                        content_type="application/json")
        assert r.status_code == 200, r.content
    assert Batch.objects.get(pk=r.json()["id"]).host == name


def test_a_create_body_holding_a_lone_surrogate_is_a_400_naming_it() -> None:
    """``"input_file_id": "file-\\ud800"`` was a 500 on every database (the lookup's UTF-8
    encoding failed); every other body of the API is a 400 ``invalid_value`` naming where the
    surrogate is (docs/api.md, the error table)."""
    client = Client(raise_request_exception=False)
    f = File.objects.create(purpose="batch", filename="in.jsonl", bytes=1, content=json.dumps(LINE).encode(), owner="")
    for body, param in (('{"input_file_id": "file-\\ud800", "endpoint": "/v1/completions", "completion_window": "24h"}', "input_file_id"),
                        ('{"input_file_id": "' + f.id + '", "endpoint": "/v1/completions", "completion_window": "24h", "metadata": {"k": "\\udc00"}}', "metadata.k")):
        r = client.post("/v1/batches", body, content_type="application/json")
        assert r.status_code == 400, r.content
        assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("invalid_value", param), r.content
    assert Batch.objects.count() == 0
