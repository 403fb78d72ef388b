"""``GET /slots``: ``id_task`` is an integer, as llama-server's (its task's id; a typed client,
a Go or Rust struct with an integer field, failed to decode our lanes). The job's own id (the
request's ``x-request-id``) is ``job_id``.

Seen: ``"id_task": "6ad432ea7e28400bb0d22f9111705618"`` on a busy lane and ``null`` on an idle one."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from django.test import RequestFactory

from superfluid_site.runtime import forget, web_runtime


async def slots() -> list[dict[str, Any]]:
    from api.views import slots as view

    response = await view.__wrapped__(RequestFactory().get("/slots"))  # type: ignore[attr-defined]
    assert response.status_code == 200
    return json.loads(response.content)  # type: ignore[no-any-return]


async def slots_of(*lanes: dict[str, Any], lane_ctx: int = 512, times: int = 1) -> list[list[dict[str, Any]]]:
    """GET /slots ``times`` over, the worker's snapshot holding ``lanes``."""
    web_runtime().link = SimpleNamespace(connected=True, inflight={}, snapshot={"lane_ctx": lane_ctx, "lanes": list(lanes)})
    try:
        return [await slots() for _ in range(times)]
    finally:
        forget(asyncio.get_running_loop())


async def test_id_task_is_an_integer_stable_for_its_job_and_job_id_its_id() -> None:
    jobs = ["6ad432ea7e28400bb0d22f9111705618", "0f3c2b1a9e8d7c6b5a4f3e2d1c0b9a88"]
    first, again = await slots_of(
        {"lane": 0, "state": "decode", "job_id": jobs[0], "generated": 5},
        {"lane": 1, "state": "prefill", "job_id": jobs[1]},
        {"lane": 2, "state": "idle"},
        times=2,
    )
    ids = [lane["id_task"] for lane in first]
    assert all(type(i) is int for i in ids), ids
    assert ids[2] == -1 and ids[0] >= 0 and ids[1] >= 0 and ids[0] != ids[1]  # idle: llama.cpp's "no task"
    assert ids[0] < 2**31 and ids[1] < 2**31  # an int32, as llama-server's
    assert [lane["id_task"] for lane in again] == ids  # the same job, the same number
    assert [lane["job_id"] for lane in first] == [*jobs, None]
