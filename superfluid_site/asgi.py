"""ASGI entry point: generation endpoints are Channels consumers; everything else is Django."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "superfluid_site.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path, re_path  # noqa: E402

from api.consumers import ChatCompletionsConsumer, CompletionsConsumer  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": URLRouter(
            [
                path("v1/chat/completions", ChatCompletionsConsumer.as_asgi()),
                path("v1/completions", CompletionsConsumer.as_asgi()),
                re_path(r"", django_asgi_app),
            ]
        ),
    }
)
