"""A batch whose stored endpoint this server cannot run (a database written by a later version,
then a downgrade): each line fails with a clear error instead of raising in the runner, which
gave the line up to be claimed and tried again for ever."""

from __future__ import annotations

import asyncio

import pytest

from batches import runner
from batches.models import Batch, File, Line

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_line_of_an_endpoint_the_server_cannot_run_fails_with_an_error_object(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_resumed", True)
    f = File.objects.create(purpose="batch", filename="in.jsonl", bytes=1, content=b"x", owner="")
    b = Batch.objects.create(endpoint="/v1/responses", input_file=f, owner="", total=1)
    Line.objects.create(batch=b, index=0, custom_id="c0", body={"model": "m", "input": "hi"})
    runner.begin(b.id)
    line = runner.claim(b.id)
    assert line is not None
    ok, out = asyncio.run(runner.run_line(Batch.objects.get(pk=b.id), line))
    assert not ok and out is not None
    assert out["custom_id"] == "c0" and out["response"]["status_code"] == 400
    assert out["response"]["body"]["error"]["code"] == "invalid_value"
    assert "/v1/responses" in out["response"]["body"]["error"]["message"]
