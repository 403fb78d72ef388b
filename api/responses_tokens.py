"""``POST /v1/responses/input_tokens`` (and ``/responses/input_tokens``), llama-server's: how
many tokens a Responses API body's input is, its instructions, tools and template included,
without generating: ``{"object": "response.input_tokens", "input_tokens": n}``. The body is
translated as ``POST /v1/responses`` translates it (api/responses_api.py), rendered and counted
as ``/v1/chat/completions/input_tokens`` counts a chat (api/rendering.py: the chat's
``usage.prompt_tokens``); ``model``, keys and the per-key limits as for ``/apply-template``."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from .admission import key_required
from .rendering import RenderedChat, count_chat_tokens
from .responses_api import responses_request_from
from .views import rendered_chat


@key_required()
async def input_tokens(request: HttpRequest) -> HttpResponse:
    def to_wire(body: dict[str, Any], model: str, strict: bool) -> dict[str, Any]:
        request, _asked = responses_request_from({**body, "model": model}, models=[model], strict=strict)
        return request.to_wire()

    def count(vocab: Any, chat: RenderedChat) -> HttpResponse:
        return JsonResponse({"object": "response.input_tokens", "input_tokens": count_chat_tokens(vocab, chat, param="input")})

    return await rendered_chat(request, count, to_wire, param="input")
