"""``POST /v1/responses/input_tokens`` (and ``/responses/input_tokens``), llama-server's: how
many tokens a Responses API body's input is, its instructions, tools and template included,
without generating: ``{"object": "response.input_tokens", "input_tokens": n}``. The body is
translated as ``POST /v1/responses`` translates it (api/responses_api.py) and rendered with the
model's chat template as ``/apply-template`` renders a chat (api/views.py), then tokenised as
the worker tokenises a chat's prompt (special tokens parsed, BOS where the vocabulary adds one);
``model``, keys and the per-key limits as for ``/tokenize``."""

from __future__ import annotations

import asyncio
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from scheduler.link.pool import get_pool
from superfluid_site.serving import serving

from .admission import admit_tool, key_required
from .edge import error_response
from .errors import ApiError, invalid_request, server_error
from .responses_api import responses_request_from


def prompt_text(vocab: Any, wire: dict[str, Any]) -> str:
    """The chat request ``wire`` (its wire form) rendered as its worker renders it, with the
    assistant turn's opening: the steps of ``/apply-template``'s (api/views.py)."""
    from scheduler.engines.chat import (
        compile_chat_template,
        merge_system_turn,
        render_chat_template,
        takes_system_turn,
        template_inputs,
    )

    source, bos, eos = vocab.template_parts()
    messages, extra = template_inputs(wire["messages"], wire.get("tools"), source, wire.get("chat_template_kwargs"), native_ok=True)
    template = compile_chat_template(source)
    try:
        if messages and messages[0].get("role") == "system" and not takes_system_turn(lambda msgs: render_chat_template(template, msgs, bos_token=bos, eos_token=eos)):
            messages = merge_system_turn(messages)
        return str(render_chat_template(template, messages, bos_token=bos, eos_token=eos, add_generation_prompt=True, **extra))
    except ValueError as exc:  # a template's raise_exception, or messages it cannot handle
        raise invalid_request(f"The chat template rejected the input: {exc}", param="input", code="invalid_messages") from None


@key_required()
async def input_tokens(request: HttpRequest) -> HttpResponse:
    from scheduler.engines.base import EngineError

    from .views import _asked_model, _json_body, _served_models, _with_tool_vocab

    try:
        body = await asyncio.to_thread(_json_body, request)
        asked = await _asked_model(request, body)
        pool = get_pool()
        if asked is not None:
            model = asked
        elif pool is not None:
            model = pool.config.models[0].id
        else:
            model = next(iter(await _served_models()), "")
        strict = serving().strict_params

        def parse() -> dict[str, Any]:
            request, _asked = responses_request_from({**body, "model": model}, models=[model], strict=strict)
            return request.to_wire()

        # the body checked first, as a response's is before its admission: a bad one costs no token
        wire = await asyncio.to_thread(parse)
        admission = await admit_tool(request.principal)
    except ApiError as exc:
        return error_response(exc)

    def work(vocab: Any) -> HttpResponse:
        try:
            text = prompt_text(vocab, wire)
        except EngineError as exc:  # the model's template does not compile
            raise server_error(f"The model's chat template could not be used: {exc}") from None
        n = len(vocab.tokenize(text, add_special=True, parse_special=True))
        return JsonResponse({"object": "response.input_tokens", "input_tokens": n})

    return await _with_tool_vocab(asked, admission, work)
