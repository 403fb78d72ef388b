"""ASGI entry point: generation endpoints are Channels consumers; everything else is Django;
the dashboard's websocket is a Channels consumer behind the session auth and an origin check."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "superfluid_site.settings")
django_asgi_app = get_asgi_application()

# The admin's (and the dashboard login's) CSS and JS, straight from the installed apps: no
# collectstatic step and no separate web server needed.
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

django_asgi_app = ASGIStaticFilesHandler(django_asgi_app)

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import path, re_path  # noqa: E402

from api.anthropic import MessagesConsumer  # noqa: E402
from api.consumers import (  # noqa: E402
    ChatCompletionsConsumer,
    CompletionsConsumer,
    EmbeddingsConsumer,
    InfillConsumer,
    NativeCompletionConsumer,
)
from api.native_embeddings import NativeEmbeddingsConsumer  # noqa: E402
from api.responses_api import ResponsesConsumer  # noqa: E402
from batches.asgi import BoundedBody  # noqa: E402
from dashboard.routing import websocket_urlpatterns as dashboard_websockets  # noqa: E402


async def refuse_websocket(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]], send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """A websocket to a path that takes none: closed before it opens (daphne answers 403)."""
    if (await receive())["type"] == "websocket.connect":
        await send({"type": "websocket.close"})


application = ProtocolTypeRouter(
    {
        "http": URLRouter(
            [
                path("v1/chat/completions", ChatCompletionsConsumer.as_asgi()),
                path("v1/completions", CompletionsConsumer.as_asgi()),
                path("v1/responses", ResponsesConsumer.as_asgi()),  # OpenAI's Responses API (Codex, the Agents SDK)
                path("responses", ResponsesConsumer.as_asgi()),  # (llama-server's second name)
                path("infill", InfillConsumer.as_asgi()),  # llama-server's fill-in-the-middle (editors' plugins)
                # llama-server's native completion (its two names), in its shapes
                path("completion", NativeCompletionConsumer.as_asgi()),
                path("completions", NativeCompletionConsumer.as_asgi()),
                path("v1/messages", MessagesConsumer.as_asgi()),  # Anthropic's Messages API (api/anthropic.py)
                path("v1/embeddings", EmbeddingsConsumer.as_asgi()),
                # llama-server's names without /v1 (OpenAI clients given a base URL without it), and its native embeddings
                path("chat/completions", ChatCompletionsConsumer.as_asgi()),
                path("embedding", NativeEmbeddingsConsumer.as_asgi()),
                path("embeddings", NativeEmbeddingsConsumer.as_asgi()),
                path("v1/files", BoundedBody(django_asgi_app)),  # an upload's size, bounded before Django reads it
                re_path(r"", django_asgi_app),
            ]
        ),
        # the live dashboard: staff sessions only (the consumer refuses anyone else); a websocket
        # to any other path is refused (the router raised for it: a traceback in the log each time)
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter([*dashboard_websockets, re_path(r"", refuse_websocket)]))),
    }
)
