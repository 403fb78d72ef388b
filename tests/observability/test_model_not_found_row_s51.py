"""A request for a model this server does not serve (a client left on ``gpt-4o``, a typo) is a 404
``model_not_found``; its activity row and access line named no model, so an operator could not
see what the client asked for. They name it now, as the client spelled it (the row's column
keeps 200 characters; the access line quotes what needs it: tests/observability/test_access_line_quoting.py)."""

from __future__ import annotations

import json

import pytest

from tests.edge.inproc import JSON, SimWorker, attached, request

from .test_activity_rows import rows

pytestmark = pytest.mark.django_db(transaction=True)


async def test_a_request_for_a_model_not_served_names_it_on_its_row() -> None:
    asked = ["gpt-4o", "claude-sonnet-4-5 \"x\"=y", "m" * 5000]
    async with attached(SimWorker()):
        for model in asked:
            body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hi"}]}).encode()
            reply = await request("POST", "/v1/chat/completions", body, JSON)
            assert reply.status == 404 and reply.json()["error"]["code"] == "model_not_found"
        wrong_type = await request("POST", "/v1/chat/completions", json.dumps({"model": 5, "messages": []}).encode(), JSON)
        assert wrong_type.status == 400
    got = await rows("model", "status", "error_code")
    assert got[:3] == [{"model": m[:200], "status": 404, "error_code": "model_not_found"} for m in asked]
    assert got[3]["model"] == ""  # (no model name was sent)
