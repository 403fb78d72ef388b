"""llama-server's plain routes beyond /tokenize, /props and /slots (api/views.py), answered as
llama-server answers them (tools/server/server-context.cpp):

- ``POST /chat/completions/input_tokens`` (and under /v1): a chat body's prompt tokens, counted
  without running the model, as its ``handle_count_tokens``;
- the routes of features this server does not have, as llama-server answers them when they are
  not enabled: ``/rerank`` (and ``/reranking``, ``/v1/rerank``, ``/v1/reranking``), ``POST
  /props`` and ``POST /slots/{id}`` are 501 ``not_supported_error``; ``/lora-adapters`` is
  llama-server's with no adapter loaded (``[]``; a POST changes nothing).
"""

from __future__ import annotations

import asyncio
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from .admission import key_required
from .edge import error_response
from .errors import ApiError, invalid_request, not_found
from .rendering import RenderedChat, count_chat_tokens
from .views import props, rendered_chat

NOT_SUPPORTED = "not_supported_error"  # llama-server's ERROR_TYPE_NOT_SUPPORTED, its status 501


def not_supported(message: str) -> ApiError:
    return ApiError(501, message, type=NOT_SUPPORTED, code="not_supported")


@key_required()
async def chat_input_tokens(request: HttpRequest) -> HttpResponse:
    """``{"input_tokens": n, "object": "response.input_tokens"}``, llama-server's shape: the
    tokens of the prompt /apply-template renders for the body, counted as the worker tokenises a
    chat (the count its ``usage.prompt_tokens`` says)."""

    def count(vocab: Any, chat: RenderedChat) -> HttpResponse:
        return JsonResponse({"input_tokens": count_chat_tokens(vocab, chat), "object": "response.input_tokens"})

    return await rendered_chat(request, count)


@key_required()
async def rerank(request: HttpRequest) -> HttpResponse:
    return error_response(not_supported("This server does not support reranking: no reranking model is served."))


async def props_route(request: HttpRequest) -> HttpResponse:
    """GET: /props (api/views.py); POST: llama-server's without ``--props``, 501 (each checks
    the key once)."""
    if request.method == "POST":
        return await _change_props(request)
    return await props(request)


@key_required()
async def _change_props(request: HttpRequest) -> HttpResponse:
    return error_response(not_supported("This server does not support changing global properties."))


@key_required()
async def slot_action(request: HttpRequest, id_slot: str) -> HttpResponse:
    """llama-server's slot save/restore/erase (POST), as it answers without ``--slot-save-path``;
    another method is the unknown route it is there (404)."""
    if request.method != "POST":
        return error_response(not_found(request.path, request.method))
    return error_response(not_supported("This server does not support slot actions (save, restore, erase)."))


@key_required()
async def lora_adapters(request: HttpRequest) -> HttpResponse:
    """No LoRA adapter is loaded here: GET ``[]``; POST (an array of ``{"id", "scale"}``)
    ``{"success": true}``, changing nothing, as llama-server answers both with none loaded; a
    body that is not an array is 400, as there."""
    if request.method != "POST":
        return JsonResponse([], safe=False)
    try:
        body = await asyncio.to_thread(_json_array, request)
    except ApiError as exc:
        return error_response(exc)
    del body
    return JsonResponse({"success": True})


def _json_array(request: HttpRequest) -> list[Any]:
    from superfluid_site.serving import serving

    from .errors import request_too_large
    from .schemas import INVALID_JSON_MESSAGE, json_value

    limit = serving().max_body_bytes
    raw = request.read(limit + 1)
    if len(raw) > limit:
        raise request_too_large(limit)
    try:
        value = json_value(raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8"))
    except ValueError:  # (UnicodeDecodeError is one)
        raise invalid_request(INVALID_JSON_MESSAGE, code="invalid_json") from None
    if not isinstance(value, list):
        raise invalid_request('The request body must be an array of {"id", "scale"}.', code="invalid_type")
    return value
