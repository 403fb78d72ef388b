"""Plain (non-streaming) endpoints: models, health, slots."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import zlib
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from scheduler.core.router import ModelState
from scheduler.link.pool import ModelPool, PoolLink, get_pool
from superfluid_site.runtime import get_link, web_runtime
from superfluid_site.serving import serving

from . import responses
from .admission import Admission, admit_tool, key_first, key_required, model_allowed
from .edge import error_response
from .errors import (
    ApiError,
    engine_unavailable,
    invalid_request,
    method_not_allowed,
    model_not_found,
    not_found,
    request_too_large,
)
from .rendering import RenderedChat, render_chat

_STARTED = int(time.time())
log = logging.getLogger("superfluid.api")


async def _served_models() -> list[str]:
    link = get_link()
    await link.wait_connected(min(5.0, float(serving().engine_wait_s)))
    if link.hello is not None:
        return [link.hello.model]
    return list(serving().models)


def _allowed(request: HttpRequest, models: list[str]) -> list[str]:
    policy = request.principal.policy  # type: ignore[attr-defined]
    return [m for m in models if policy is None or model_allowed(policy, m)]


def _pool_objects(pool: ModelPool, request: HttpRequest) -> dict[str, dict[str, Any]]:
    """Every configured id and alias, loaded or not, with its context length and state."""
    out: dict[str, dict[str, Any]] = {}
    for m in pool.models_state():
        for name in (m["id"], *m["aliases"]):
            extra: dict[str, Any] = {"context_length": m["context_length"], "state": m["state"]}
            hello = getattr(pool.links.get(m["id"]), "hello", None)
            meta = model_meta(hello, m["context_length"]) if hello is not None else {}
            if meta:  # a loaded model's, as its worker said them
                extra["meta"] = meta
            if name != m["id"]:
                extra["alias_of"] = m["id"]
            out[name] = responses.model_object(name, _STARTED, **extra)
    allowed = set(_allowed(request, list(out)))
    return {name: obj for name, obj in out.items() if name in allowed}


def _model_extra() -> dict[str, Any]:
    """``context_length`` (tokens one request may use: a lane's context) and llama-server's
    ``meta`` (``n_ctx``, ``n_ctx_train``, ``n_vocab``, ...) where the worker said them."""
    hello = get_link().hello
    extra: dict[str, Any] = {}
    if hello is None:
        return extra
    if hello.lane_ctx:
        extra["context_length"] = hello.lane_ctx
    meta = model_meta(hello, hello.lane_ctx)
    if meta:
        extra["meta"] = meta
    return extra


def model_meta(hello: Any, n_ctx: int | None = None) -> dict[str, Any]:
    """llama-server's ``meta`` of a model object, the fields its worker's hello said; ``n_ctx``
    the object's ``context_length`` (a slot's context, as llama-server's meta.n_ctx says it)."""
    fields = (
        ("n_vocab", hello.n_vocab), ("n_ctx", n_ctx), ("n_ctx_train", hello.n_ctx_train), ("n_embd", hello.n_embd),
        ("n_params", hello.n_params), ("size", hello.model_size), ("ftype", hello.model_ftype),
    )  # fmt: skip
    return {k: v for k, v in fields if v}


@key_required()
async def models(request: HttpRequest) -> JsonResponse:
    pool = get_pool()
    if pool is not None:
        return JsonResponse(responses.model_list(_pool_objects(pool, request).values()))
    extra = _model_extra()
    objs = [responses.model_object(m, _STARTED, **extra) for m in _allowed(request, await _served_models())]
    return JsonResponse(responses.model_list(objs))


@key_required()
async def model_detail(request: HttpRequest, model_id: str) -> JsonResponse:
    pool = get_pool()
    if pool is not None:
        found = _pool_objects(pool, request).get(model_id)
        return JsonResponse(found) if found is not None else error_response(model_not_found(model_id))
    if model_id not in _allowed(request, await _served_models()):
        return error_response(model_not_found(model_id))
    return JsonResponse(responses.model_object(model_id, _STARTED, **_model_extra()))


# -- llama-server's /tokenize, /detokenize and /props --------------------------------------


def _json_body(request: HttpRequest) -> dict[str, Any]:
    # the method is checked by edge.api_route(("POST",)) in urls.py. Read from the stream, not
    # request.body: Django's DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB) refused a body under
    # --max-body-bytes (a document to count the tokens of) with a 400 "could not be understood"
    from .schemas import load_object

    limit = serving().max_body_bytes
    raw = request.read(limit + 1)
    if len(raw) > limit:  # (serve's protocol layer refuses it first, on its Content-Length)
        raise request_too_large(limit)
    return load_object(raw or b"{}")


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid_request(f"Invalid value for '{name}': expected a boolean.", param=name, code="invalid_type")
    return value


async def _asked_model(request: HttpRequest, body: dict[str, Any]) -> str | None:
    """The body's optional ``model`` (an id or an alias) for /tokenize and /detokenize, as the
    key may use it: None for the first configured; with several models, the first the key may
    use (key_first); 404 ``model_not_found`` as for a chat, and as /props for a key that may use
    none of them."""
    from .schemas import named_model

    model = named_model(body)
    if model is None:
        policy = request.principal.policy  # type: ignore[attr-defined]
        if policy is not None and policy.allowed_models:  # (no wait for a worker away otherwise)
            pool = get_pool()
            served = [m.id for m in pool.config.models] if pool is not None else await _served_models()
            first = key_first(served, policy)[:1]
            if first and not _allowed(request, first):
                raise model_not_found(first[0])
            if first and first[0] != served[0]:
                return first[0]
        return None
    if not isinstance(model, str):
        raise invalid_request("Invalid value for 'model': expected a string.", param="model", code="invalid_type")
    pool = get_pool()
    served = pool.names() if pool is not None else await _served_models()
    if model not in served or not _allowed(request, [model]):
        raise model_not_found(model)
    return model


async def _vocab(model: str | None = None) -> Any:
    """The vocabulary of ``model`` (an id or alias) where several models are served, else of
    the one model (without one: the first configured)."""
    return await asyncio.to_thread(vocab_of, model)


def vocab_of(model: str | None = None) -> Any:
    """:func:`_vocab`, blocking (it may open the model's file): in a thread. A file that cannot
    be read (cut short, replaced or removed since serve checked it: a model whose load fails
    too) is 503 ``engine_unavailable``, as a generation request for that model is answered, not
    a bare 500; its message is in serve's log, as for a load."""
    from .tokenizer import vocab_for

    cfg = serving()
    path = dict(cfg.model_paths).get(model or "", cfg.model_path)
    if not path:
        from scheduler.engines.models import default_model_path

        path = str(default_model_path())
    try:
        return vocab_for(path)
    except Exception as exc:  # llama.cpp's NULL model (RuntimeError), a tokenizer.json that does not parse, an OSError
        name = model or (cfg.models[0] if cfg.models else os.path.splitext(os.path.basename(path))[0])
        log.error("the vocabulary of the model %s could not be read from %s: %s", name, path, exc)
        raise engine_unavailable(f"The model '{name}' could not be loaded: its vocabulary could not be read (its message is in serve's log).") from None


async def _tool_vocab(model: str | None, admission: Admission) -> Any:
    """The vocabulary a tokenizer route works with, for a request that took its limits: a model
    that cannot be read gives its rate token back (a 503 of the server's, as a generation request
    refused ``engine_unavailable`` before any engine saw it: docs/keys.md)."""
    try:
        return await _vocab(model)
    except ApiError:
        admission.refund()
        raise


_JSON_SLICE = 4096  # tokens /tokenize encodes at a time


def _piece(raw: bytes) -> str | list[int]:
    """A token's text as llama-server gives it: a string, or its bytes when not valid UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


async def _with_tool_vocab(model: str | None, admission: Admission, work: Callable[[Any], HttpResponse]) -> HttpResponse:
    """A tokenizer route's reply: ``work(vocab)`` off the event loop (its ApiError the reply), for
    a request that took its limits, which are given back when it ends."""
    try:
        vocab = await _tool_vocab(model, admission)
        return await asyncio.to_thread(work, vocab)
    except ApiError as exc:
        return error_response(exc)
    finally:
        await admission.release()


def naming_ignored(response: HttpResponse, names: list[str]) -> HttpResponse:
    """``response`` with ``x-superfluid-ignored-params`` naming ``names``, the body's parameters
    not honoured (each once), as the generating route names them (a count route counts what it
    would run)."""
    if names:
        response[responses.IGNORED_PARAMS_HEADER] = responses.ignored_params_value(dict.fromkeys(names))
    return response


@key_required()
async def tokenize(request: HttpRequest) -> HttpResponse:
    """``{"content": str, "add_special": false, "parse_special": true, "with_pieces": false}``
    -> ``{"tokens": [ids]}`` (or ``[{"id", "piece"}]`` with pieces), as llama-server answers;
    ``content`` may also be an array of strings and token ids (:func:`_tokenized_mixed`);
    ``"model"`` (an id or an alias) picks the model's vocabulary where several are served. A
    body without ``content`` answers ``{"tokens": []}``, add_special or not, as llama-server's."""

    def read() -> tuple[dict[str, Any], Any]:  # up to --max-body-bytes (a million ids): off the event loop
        body = _json_body(request)
        content = body.get("content", "")
        if not isinstance(content, str) and not (
            isinstance(content, list) and all(isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)) for v in content)
        ):
            raise invalid_request(
                "Invalid value for 'content': expected a string, or an array of strings and token ids.", param="content", code="invalid_type"
            )
        return body, content

    try:
        body, content = await asyncio.to_thread(read)
        add_special, parse_special = _flag(body, "add_special", False), _flag(body, "parse_special", True)
        with_pieces = _flag(body, "with_pieces", False)
        model = await _asked_model(request, body)
        admission = await admit_tool(request.principal)  # type: ignore[attr-defined]
    except ApiError as exc:
        return error_response(exc)

    def work(vocab: Any) -> HttpResponse:  # a body's worth of text: seconds, off the event loop, its JSON too
        if isinstance(content, str):
            tokens = vocab.tokenize(content, add_special=add_special, parse_special=parse_special) if "content" in body else []
        else:
            tokens = _tokenized_mixed(vocab, content, add_special=add_special, parse_special=parse_special)
        items = [{"id": t, "piece": _piece(vocab.piece(t))} for t in tokens] if with_pieces else tokens
        # a slice at a time: one json.dumps of a million tokens holds the GIL, and so the event
        # loop and every stream on it, for most of a second
        parts = (json.dumps(items[i : i + _JSON_SLICE])[1:-1] for i in range(0, len(items), _JSON_SLICE))
        return HttpResponse('{"tokens": [' + ", ".join(parts) + "]}", content_type="application/json")

    return await _with_tool_vocab(model, admission, work)


def _tokenized_mixed(vocab: Any, content: list[str | int], *, add_special: bool, parse_special: bool) -> list[int]:
    """/tokenize's ``content`` given as an array of strings and token ids, as llama-server's
    ``tokenize_mixed`` reads it: each string tokenised (``add_special`` only for a string that
    begins the array), each id as it is; an id outside the vocabulary is 400, as /detokenize's."""
    tokens: list[int] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            tokens += vocab.tokenize(part, add_special=add_special and i == 0, parse_special=parse_special)
        elif 0 <= part < vocab.n_vocab:
            tokens.append(part)
        else:
            raise invalid_request(
                f"Invalid value for 'content': token ids must be between 0 and {vocab.n_vocab - 1}.", param="content", code="invalid_value"
            )
    return tokens


@key_required()
async def detokenize(request: HttpRequest) -> HttpResponse:
    """``{"tokens": [ids]}`` -> ``{"content": str}``; ``"model"`` as for /tokenize. A body
    without ``tokens`` answers ``{"content": ""}``, as llama-server's."""
    from .tokenizer import detokenize as text_of

    def read() -> tuple[dict[str, Any], list[int]]:  # a million ids: half a second, off the event loop
        body = _json_body(request)
        tokens = body.get("tokens", [])
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise invalid_request("Invalid value for 'tokens': expected an array of token ids.", param="tokens", code="invalid_type")
        return body, tokens

    def work(vocab: Any, tokens: list[int]) -> JsonResponse:
        if any(not 0 <= t < vocab.n_vocab for t in tokens):
            raise invalid_request(f"Invalid value for 'tokens': token ids must be between 0 and {vocab.n_vocab - 1}.", param="tokens", code="invalid_value")
        return JsonResponse({"content": text_of(vocab, tokens)})

    try:
        body, tokens = await asyncio.to_thread(read)
        model = await _asked_model(request, body)
        admission = await admit_tool(request.principal)  # type: ignore[attr-defined]
    except ApiError as exc:
        return error_response(exc)
    return await _with_tool_vocab(model, admission, lambda vocab: work(vocab, tokens))


@key_required()
async def apply_template(request: HttpRequest) -> HttpResponse:
    """llama-server's ``POST /apply-template``: a chat body's ``messages`` (with its ``tools``,
    ``chat_template_kwargs``, ``reasoning_effort``) rendered with the model's chat template as
    its worker renders them, without generating: ``{"prompt": text}``. ``model`` as for
    /tokenize (the first configured without one); ``add_generation_prompt`` (default true)."""
    return await rendered_chat(request, lambda _vocab, chat: JsonResponse({"prompt": chat.text}))


async def rendered_chat(
    request: HttpRequest,
    answer: Callable[[Any, RenderedChat], HttpResponse],
    to_wire: Callable[[dict[str, Any], str, bool], dict[str, Any]] | None = None,
    param: str = "messages",
) -> HttpResponse:
    """/apply-template's work: the reply is ``answer(vocab, chat)`` (in a thread), ``chat`` the
    chat body rendered as its worker renders it (the input_tokens routes count its tokens).
    ``to_wire(body, model, strict)`` is the chat request a body of another API's shape runs as
    (the Responses API's; its errors name that API's fields, ``param`` the conversation's); a
    chat body's own ``add_generation_prompt`` (default true) is read only without one."""
    from .schemas import chat_request_from

    try:
        body = await asyncio.to_thread(_json_body, request)
        asked = await _asked_model(request, body)
        add_generation_prompt = _flag(body, "add_generation_prompt", True) if to_wire is None else True
        pool = get_pool()
        if asked is not None:
            model = asked
        elif pool is not None:
            model = pool.config.models[0].id
        else:
            model = next(iter(await _served_models()), "")
        strict = serving().strict_params
        if to_wire is None:
            chat = {k: v for k, v in body.items() if k != "add_generation_prompt"}
            wire = (await asyncio.to_thread(chat_request_from, {**chat, "model": model}, models=[model], strict=strict, prefill=serving().prefill_assistant)).to_wire()
        else:
            wire = await asyncio.to_thread(to_wire, body, model, strict)
        # the body checked first, as a chat's is before its admission: a bad one costs no token
        admission = await admit_tool(request.principal)  # type: ignore[attr-defined]
    except ApiError as exc:
        return error_response(exc)

    def work(vocab: Any) -> HttpResponse:
        return naming_ignored(answer(vocab, render_chat(vocab, wire, add_generation_prompt=add_generation_prompt, param=param)), wire["ignored"])

    return await _with_tool_vocab(asked, admission, work)


@key_required()
async def props(request: HttpRequest) -> JsonResponse:
    """llama-server's ``/props``: the served model, its context per request, the lanes. With
    several models, one model's, every field of the same one: ``?model=`` (an id or an alias),
    else the first configured the key may use (the fields once came from three different models)."""
    from .schemas import LLAMA_SERVER_SAMPLING

    pool = get_pool()
    if pool is not None:
        asked = request.GET.get("model")
        model_id = pool.resolve(asked) if asked else key_first([m.id for m in pool.config.models], request.principal.policy)[0]  # type: ignore[attr-defined]
        if model_id is None or not _allowed(request, [asked or model_id]):  # as /v1/models lists them
            return error_response(model_not_found(asked or model_id))
        served = next(m for m in pool.config.models if m.id == model_id)
        link = pool.links.get(model_id)
        hello = link.hello if link is not None else None
        alias, path, vocab_model = model_id, str(served.path), model_id
        slots, n_ctx = pool.setup.lanes.get(model_id), pool.setup.ctx_sizes.get(model_id)
    else:
        models = await _served_models()
        if models and not _allowed(request, models[:1]):  # as /v1/models lists it, as with several
            return error_response(model_not_found(models[0]))
        link = get_link()
        hello = link.hello
        alias, path, vocab_model = (models[0] if models else None), (serving().model_path or None), None
        slots, n_ctx = (hello.n_lanes if hello else None), (hello.lane_ctx if hello else None)
        fleet = link.snapshot or {}
        if fleet.get("fleet"):  # a Redis fleet: every worker's lanes take this server's requests, not one worker's
            slots = int(fleet.get("n_lanes") or 0)
    # the template, BOS and EOS text from the model's file, as /apply-template reads them: known
    # before its worker says the template (a model not loaded, a Redis fleet); unknown (null)
    # where this process cannot read the file
    try:
        source, bos, eos = await asyncio.to_thread(lambda: vocab_of(vocab_model).template_parts())
    except ApiError:
        template, bos, eos = None, None, None
    else:
        from scheduler.engines.chat import CHATML

        template = source or CHATML
    if hello:
        template = hello.chat_template
    # llama-server's chat_template_caps: found by rendering probes through that template, once
    # per template (scheduler/engines/template_caps.py); null with the template unknown
    from scheduler.engines.template_caps import chat_template_caps

    caps = await asyncio.to_thread(chat_template_caps, template) if template is not None else None
    return JsonResponse(
        {
            "model_alias": alias,
            "model_path": path,
            "total_slots": slots,
            "default_generation_settings": {
                "n_ctx": n_ctx,
                # what an absent parameter is on llama-server's routes (/completion, /infill), as
                # llama-server's clients read it here; the OpenAI routes keep OpenAI's (docs/api.md)
                # (typed as llama-server's task_params: n_predict -1 no limit, seed its default
                # 4294967295, LLAMA_DEFAULT_SEED, which typed clients decode as numbers)
                "params": {**LLAMA_SERVER_SAMPLING, "typical_p": 1.0,
                           "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                           "seed": 0xFFFFFFFF, "n_predict": -1, "max_tokens": -1, "ignore_eos": False,
                           "stream": False, "n_probs": 0},
            },
            "engine": hello.engine if hello else None,
            # the template chats are rendered with (llama-server's: the model's, else ChatML)
            "chat_template": template,
            "chat_template_caps": caps,
            "bos_token": bos,  # llama-server's: the text of the model's BOS and EOS tokens ("" for none)
            "eos_token": eos,
            "model_ftype": hello.model_ftype if hello else None,  # llama-server's ("Q4_1", ...), as the worker said it
            "modalities": {"vision": False, "video": False, "audio": False},  # llama-server's three
            "build_info": "superfluid",
        }
    )


def _unavailable(status: str, message: str) -> JsonResponse:
    """A 503 from /health: this API's ``status`` and llama-server's error object (its ``code``
    the number 503, its type ``unavailable_error``, as llama-server writes it while it loads)."""
    error = {"message": message, "type": "unavailable_error", "param": None, "code": 503}
    return JsonResponse({"status": status, "error": error}, status=503)


async def health(request: HttpRequest) -> JsonResponse:
    pool = get_pool()
    if pool is not None:  # the router is up; models load on demand
        if pool.draining or pool.link.draining:
            return _unavailable("draining", "Server is shutting down")
        return JsonResponse({"status": "ok", "models": {m["id"]: m["state"] for m in pool.models_state()}})
    link = get_link()
    if link.draining:
        return _unavailable("draining", "Server is shutting down")
    if not link.connected:
        return _unavailable("loading", "Loading model")
    assert link.hello is not None
    return JsonResponse({"status": "ok", "model": link.hello.model, "worker_pid": link.hello.pid, "worker_restarts": link.worker_restarts})


@key_required(admin=True)
async def slots(request: HttpRequest) -> JsonResponse:
    """The worker's lanes, llama-server's /slots shape plus class, state and progress (a Redis
    fleet's: every worker's lanes, numbered across the fleet, each with its ``worker`` and
    ``host``; ``?fail_on_no_slot`` looks at them all). With
    several models, ``?model=`` (an id or an alias) picks the model (404 ``model_not_found`` for
    another name; none: the model used last); one not loaded has none. A worker away (crashed,
    restarting) has its lanes idle: its last snapshot's jobs are nobody's there any more."""
    link = get_link()
    state = link.snapshot or {}
    connected = bool(getattr(link, "snapshot_connected", link.connected))  # a pool's: the shown model's worker
    pool = link.pool if isinstance(link, PoolLink) else None
    asked = request.GET.get("model")
    if pool is not None and asked:
        model_id = pool.resolve(asked)
        if model_id is None:
            return error_response(model_not_found(asked))
        model_link = pool.links.get(model_id)
        state = (model_link.snapshot if model_link is not None else None) or {}
        connected = model_link is not None and bool(model_link.connected)
    # a Redis fleet's view says itself who is there, while Redis answers: a head cut off from it
    # knows nothing of the fleet, and the lanes it last read were shown busy, frozen (as /metrics
    # leaves them out then)
    if (not connected and "fleet" not in state) or not getattr(link, "redis_ok", True):
        state = {**state, "lanes": [{"lane": lane.get("lane", i), "state": "idle"} for i, lane in enumerate(state.get("lanes") or [])]}
    keys = web_runtime().in_flight_keys()  # every model's jobs: a pool's own link submits none
    out = []
    for lane in state.get("lanes", []):
        busy = lane["state"] != "idle"
        prompt_tokens, prompt_done = lane.get("prompt_tokens", 0), lane.get("prompt_done", 0)
        generated = lane.get("generated", 0)
        out.append(
            {
                **{k: v for k, v in lane.items() if k not in _NEXT_TOKEN_KEYS},
                "id": lane["lane"],
                "id_task": task_number(lane.get("job_id")),
                "job_id": lane.get("job_id"),  # the request's x-request-id
                "is_processing": busy,
                "n_ctx": lane.get("lane_ctx", state.get("lane_ctx")),  # a fleet's lane: its worker's
                # llama-server's: no speculative decoding here; the prompt's tokens, those computed
                # (not taken from the cache) and those taken from it (0 on an idle lane)
                "speculative": False,
                "n_prompt_tokens": prompt_tokens,
                "n_prompt_tokens_processed": max(0, prompt_done - lane.get("cached_tokens", 0)),
                "n_prompt_tokens_cache": lane.get("cached_tokens", 0),
                # llama-server's shape: an array of one object (a slot's next token); n_remain -1:
                # no count (an idle lane, a request without a limit)
                "next_token": [
                    {
                        "has_next_token": busy,
                        "has_new_line": bool(lane.get("has_new_line", False)) and busy,
                        "n_remain": remaining(lane, generated),
                        "n_decoded": generated,
                    }
                ],
                "prompt_progress": round(prompt_done / prompt_tokens, 4) if prompt_tokens else (1.0 if busy else 0.0),
                "parked": bool(lane.get("parked", False)),
                "key": lane.get("key") or keys.get(lane.get("job_id") or ""),
                "class": lane.get("class"),
                "generated": generated,
            }
        )
    if request.GET.get("fail_on_no_slot") and not any(not slot["is_processing"] for slot in out):
        # llama-server's ?fail_on_no_slot (any value but an empty one, which it reads as absent): 503 when no lane is idle, for a proxy
        # or load balancer that sends a request elsewhere rather than queue it here
        error = {"message": "no slot available", "type": "unavailable_error", "param": None, "code": 503}
        return JsonResponse({"error": error}, status=503)
    return JsonResponse(out, safe=False)


_NEXT_TOKEN_KEYS = ("limit_asked", "has_new_line")  # a lane's, shown in its next_token only


def remaining(lane: dict[str, Any], generated: int) -> int:
    """A lane's llama-server ``next_token.n_remain``: the tokens its job may still generate
    (its limit less those generated; -1, llama-server's "no limit", where the lane is idle, the
    request gave no limit (only the context's room bounds it: llama-server's n_predict -1) or
    its worker's snapshot does not say)."""
    limit = lane.get("max_tokens")
    if not isinstance(limit, int) or lane.get("state") == "idle" or lane.get("limit_asked") is False:
        return -1
    return max(0, limit - generated)


def task_number(job_id: str | None) -> int:
    """A lane's llama-server ``id_task``, an integer (an int32 there, which typed clients decode):
    -1 for none (llama.cpp's "no task"), else a number its job's id always gives (31 bits of
    its CRC-32; the id itself is the lane's ``job_id``)."""
    return -1 if not job_id else zlib.crc32(job_id.encode()) & 0x7FFFFFFF


@key_required(admin=True)
async def state(request: HttpRequest) -> JsonResponse:
    """The worker's latest full snapshot (lanes, queues, counters) for tools and tests; with
    several models, the router's state and each resident model's snapshot."""
    pool = get_pool()
    if pool is not None:
        snapshots = {model: link.snapshot for model, link in pool.links.items() if link.snapshot}
        return JsonResponse({"router": pool.router.snapshot(), "models": pool.models_state(), "snapshots": snapshots})
    link = get_link()
    return JsonResponse(link.snapshot or {}, status=200 if link.snapshot else 503)


@key_required(admin=True)
async def admin_models(request: HttpRequest, model_id: str = "", action: str = "") -> JsonResponse:
    """Several models: GET each model's state (unloaded/loading/loaded/draining, lanes in use,
    last used); POST .../<id>/load or .../<id>/unload (an admin key, or none on loopback)."""
    pool = get_pool()
    if pool is None:
        return error_response(not_found(request.path, request.method))
    if action:
        if request.method != "POST":  # urls.py routes only POST here; kept for direct callers
            return error_response(method_not_allowed(request.method or "", ("POST",), request.path))
        resolved = pool.resolve(model_id)
        if resolved is None:
            return error_response(model_not_found(model_id))
        (pool.load if action == "load" else pool.unload)(resolved)
    return JsonResponse({"object": "list", "data": pool.models_state(), "router": pool.router.snapshot()})


# -- llama-swap's routes for its loaded models ---------------------------------------------
# A llama-swap user's scripts and tools list and free models with GET /running, GET /unload and
# the UI's POST /api/models/unload[/<model>]. They answer here as llama-swap answers them (its
# internal/server/api.go and apigroup.go), over the same pool and router as /v1/internal/models,
# with the same access (an admin key where keys are required). An unload here is superfluid's:
# the model takes no new work and is unloaded once its admitted requests are done (llama-swap
# stops its process at once). The single-model server has no pool: 404, as /v1/internal/models.

# our router's states as llama-swap names a process's (internal/process/process.go); an
# unloaded model is not running, so not listed
LLAMA_SWAP_STATES = {ModelState.LOADING: "starting", ModelState.LOADED: "ready", ModelState.DRAINING: "stopping", ModelState.UNLOADING: "stopping"}


@key_required(admin=True)
async def llama_swap_running(request: HttpRequest) -> HttpResponse:
    """``GET /running``: ``{"running": [{"model", "state", "cmd", "proxy", "ttl", "name",
    "description"}]}`` for each model not unloaded, by id (``cmd`` and ``proxy`` empty: no
    process of its own serves a model here; ``ttl`` in whole seconds, 0 for none)."""
    pool = get_pool()
    if pool is None:
        return error_response(not_found(request.path, request.method))
    running = []
    for m in sorted(pool.config.models, key=lambda m: m.id):
        state = LLAMA_SWAP_STATES.get(pool.router.state(m.id))
        if state is not None:
            ttl = int(m.ttl_s) if m.ttl_s else 0
            running.append({"model": m.id, "state": state, "cmd": "", "proxy": "", "ttl": ttl, "name": m.id, "description": ""})
    return JsonResponse({"running": running})


def _cross_site(request: HttpRequest) -> HttpResponse | None:
    """403 for a state-changing GET that a browser sent on behalf of another site's page (an
    image or a link there: no ``Origin`` for api_route to refuse, but ``Sec-Fetch-Site`` says
    so). curl and scripts send no such header; a URL typed into the address bar sends ``none``."""
    site = request.headers.get("sec-fetch-site")
    if site is None or site.strip().lower() in ("none", "same-origin"):
        return None
    return error_response(
        ApiError(403, "GET /unload is refused from another site's page; use POST /api/models/unload.", type="permission_error", code="origin_forbidden", param="origin")
    )


def _unload_all(pool: ModelPool) -> None:
    for m in pool.config.models:
        if pool.router.state(m.id).resident:
            pool.unload(m.id)


@key_required(admin=True)
async def llama_swap_unload(request: HttpRequest) -> HttpResponse:
    """``GET /unload``: every model unloaded (once its admitted work is done); ``OK``."""
    pool = get_pool()
    if pool is None:
        return error_response(not_found(request.path, request.method))
    refused = _cross_site(request)
    if refused is not None:
        return refused
    _unload_all(pool)
    return HttpResponse(b"OK", content_type="text/plain; charset=utf-8")


@key_required(admin=True)
async def llama_swap_api_unload(request: HttpRequest, model_id: str = "") -> HttpResponse:
    """``POST /api/models/unload``: every model, ``{"msg": "ok"}``; ``POST
    /api/models/unload/<model>``: that model (an id or an alias), ``OK``; an unknown one is 404
    ``model_not_found``."""
    pool = get_pool()
    if pool is None:
        return error_response(not_found(request.path, request.method))
    if not model_id:
        _unload_all(pool)
        return JsonResponse({"msg": "ok"})
    resolved = pool.resolve(model_id.lstrip("/"))
    if resolved is None:
        return error_response(model_not_found(model_id))
    pool.unload(resolved)
    return HttpResponse(b"OK", content_type="text/plain; charset=utf-8")
