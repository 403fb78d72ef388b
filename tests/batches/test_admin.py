"""Batches and files in the Django admin: they are made through the API only, and the file list
does not read what the files hold."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from batches.models import Batch, File

pytestmark = pytest.mark.django_db


def test_the_file_list_does_not_load_the_files_contents(admin_client: Client) -> None:
    """A page lists up to 100 files of up to 8 MiB each: it read all of them."""
    for i in range(3):
        File.objects.create(purpose="batch", filename=f"f{i}.jsonl", bytes=1000, content=b"x" * 1000, owner="k")
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get("/admin/batches/file/")
    assert page.status_code == 200 and "f2.jsonl" in page.content.decode()
    listed = [q["sql"] for q in queries.captured_queries if '"batches_file"' in q["sql"] and "COUNT" not in q["sql"]]
    assert listed and not any('"batches_file"."content"' in sql for sql in listed)


def test_batches_and_files_are_not_added_in_the_admin(admin_client: Client) -> None:
    """Every field is read-only there: "Add batch" was a 500, "Add file" saved an empty row."""
    assert admin_client.get("/admin/batches/batch/add/").status_code == 403
    assert admin_client.post("/admin/batches/file/add/", {}).status_code == 403
    assert not File.objects.exists() and not Batch.objects.exists()
