"""Redis mode's Channels layer (channels_redis) is for the dashboard's group. An API request
never gets a channel: Channels gives every consumer one by default, and on channels_redis that
is a receive blocking on Redis for the request's whole life, whose cancel at the request's end
held the finished consumer open for up to 10 s (found as a Batch API line on Celery that took
10.5 s to record a reply it had in 0.2 s)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from channels.layers import get_channel_layer

from superfluid_site.settings import channel_layers
from tests.edge.inproc import JSON, SimWorker, attached, chat_body, request

from .conftest import RedisServer


@pytest.fixture
def redis_layer(redis_server: RedisServer, settings: Any) -> Iterator[dict[str, int]]:
    """The real channels_redis layer on the test's Redis, with its channel calls counted."""
    settings.CHANNEL_LAYERS = channel_layers(redis_server.url)  # Channels drops its cached layers
    layer = get_channel_layer()
    assert type(layer).__name__ == "RedisChannelLayer"
    calls = {"new_channel": 0, "receive": 0}
    for name in calls:
        real = getattr(layer, name)

        async def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return await _real(*args, **kwargs)

        setattr(layer, name, counted)
    yield calls


@pytest.mark.django_db(transaction=True)
async def test_api_requests_take_no_channel_on_the_redis_layer(redis_layer: dict[str, int]) -> None:
    async with attached(SimWorker()):
        reply = await request("POST", "/v1/chat/completions", chat_body(max_tokens=3), JSON)
        assert reply.status == 200, reply.body
        streamed = await request("POST", "/v1/chat/completions", chat_body(max_tokens=3, stream=True), JSON)
        assert streamed.status == 200 and streamed.sse_data()[-1] == "[DONE]"
    assert redis_layer == {"new_channel": 0, "receive": 0}
    # the counting sees a consumer that does use the layer
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "ping"})
    assert (await layer.receive(channel))["type"] == "ping"
    assert redis_layer == {"new_channel": 1, "receive": 1}
