"""``/infill`` (llama-server's fill-in-the-middle route, which editors' plugins call) is an API
path like ``/tokenize`` or ``/props``: what Django answers under it (a trailing slash, a path
below it, a bad ``Host``) is an OpenAI error object readable by our own origin, not Django's
HTML page."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.edge import GENERATION_PATHS, is_api_path

from .inproc import JSON, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)

OURS = b"http://127.0.0.1:8000"


@pytest.mark.parametrize("path", ["/infill/", "/infill/x", "//infill/"])
@pytest.mark.parametrize("method", ["POST", "GET"])
async def test_a_path_under_infill_is_a_json_404_readable_by_our_origin(sim: SimWorker, method: str, path: str) -> None:
    async with attached(sim):
        reply = await request(method, path, b"{}", JSON + [(b"origin", OURS)])
        assert reply.status == 404 and reply.is_error_object(), (reply.status, reply.body[:120])
        assert reply.headers["content-type"].startswith("application/json")
        assert reply.json()["error"]["code"] == "not_found"
        assert reply.headers.get("access-control-allow-origin") == OURS.decode()


async def test_a_bad_host_under_infill_is_a_json_400(sim: SimWorker) -> None:
    async with attached(sim):
        reply = await request("POST", "/infill/", b"{}", JSON, host=b"rebound.attacker.example:8000")
        assert reply.status == 400 and reply.is_error_object(), (reply.status, reply.body[:120])
        assert reply.json()["error"]["code"] == "invalid_host"


@settings(max_examples=100, deadline=None)
@given(route=st.sampled_from(sorted(GENERATION_PATHS)), slashes=st.integers(1, 3), below=st.text(max_size=20))
def test_every_path_at_or_below_a_generation_route_is_an_api_path(route: str, slashes: int, below: str) -> None:
    """A generation route (a consumer) answers its own errors; what Django answers at or below it
    must be JSON too: /infill was left out of the API's paths."""
    path = "/" * slashes + route.lstrip("/")
    assert is_api_path(path) and is_api_path(path + "/" + below)
