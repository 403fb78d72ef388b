"""GET /v1/files/{id}/content of a large file (a batch's output file may be hundreds of MiB, kept
in a database column): streamed in bounded slices read with the database's substring, never the
whole column in one query, with the file's Content-Length and content type."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.db.backends.utils import CursorWrapper

from batches import views
from batches.models import File
from tests.edge.inproc import application

pytestmark = pytest.mark.django_db(transaction=True)


async def stored(data: bytes) -> File:
    """An output file holding ``data``; its thread's connection closed after (on PostgreSQL, one
    left open keeps the test database from being dropped at the end of the run)."""

    def make() -> File:
        try:
            return File.objects.create(purpose="batch_output", filename="out.jsonl", bytes=len(data), content=data, owner="")
        finally:
            connection.close()

    return await sync_to_async(make)()


def recorded_sql(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement any connection runs from here on (the view's queries run in other threads)."""
    seen: list[str] = []
    real = CursorWrapper._execute

    def execute(self: CursorWrapper, sql: str, params: Any, *ignored_wrappers: Any) -> Any:
        seen.append(sql)
        return real(self, sql, params, *ignored_wrappers)

    monkeypatch.setattr(CursorWrapper, "_execute", execute)
    return seen


async def test_a_files_content_is_read_in_bounded_slices_and_streamed(monkeypatch: pytest.MonkeyPatch) -> None:
    data = bytes(range(256)) * (5 * 1024 + 3)  # every byte value, 1.3 MB: three slices of 512 KiB
    f = await stored(data)
    monkeypatch.setattr(views, "CONTENT_SLICE", 512 * 1024, raising=False)
    sql = recorded_sql(monkeypatch)
    transport = httpx.ASGITransport(app=application(), client=("127.0.0.1", 50001))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
        r = await http.get(f"/v1/files/{f.id}/content")
        head = await http.head(f"/v1/files/{f.id}/content")
    assert r.status_code == 200 and r.content == data
    assert r.headers["content-type"] == "application/jsonl" and r.headers["content-length"] == str(len(data))
    assert head.status_code == 200 and head.headers["content-length"] == str(len(data))
    reads = [s for s in sql if "content" in s.lower() and s.lstrip().upper().startswith("SELECT")]
    whole = [s for s in reads if "SUBSTR" not in s.upper() and "LENGTH" not in s.upper()]
    assert not whole, whole  # no query reads the whole column
    assert sum("SUBSTR" in s.upper() for s in reads) == 3, reads  # the GET's three slices, the HEAD's none


async def test_an_empty_files_content_is_an_empty_reply() -> None:
    f = await stored(b"")
    transport = httpx.ASGITransport(app=application(), client=("127.0.0.1", 50001))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:
        r = await http.get(f"/v1/files/{f.id}/content")
        other = await http.get("/v1/files/file-nope/content")
    assert r.status_code == 200 and r.content == b"" and r.headers["content-length"] == "0"
    assert other.status_code == 404
