"""llama-server's route names that were 404 here: ``/chat/completions`` and ``/models`` (its names
without /v1, which OpenAI clients given a base URL without /v1 call), and its native embeddings
``/embedding``, ``/embeddings`` (server-context.cpp's ``handle_embeddings_impl`` with
``TASK_RESPONSE_TYPE_NONE``: ``content`` in, a JSON array of ``{"index", "embedding": [vector]}``
out, ``embd_normalize``). In process (tests/edge/inproc.py)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.edge.inproc import JSON, MODEL, SimWorker, attached, attached_loop, chat_body, refused_count, request

pytestmark = pytest.mark.django_db(transaction=True)


def embedding_engine(link: Any, vector: list[float] | None = None) -> list[list[int]]:
    """The simulated engine made to embed: every input's vector is ``vector`` (L2-normalised, as
    the llama.cpp engine's are); the token lists it was given come back in the list returned."""
    engine = link.worker.engine
    seen: list[list[int]] = []
    given = vector or [0.6, -0.8, 0.0]
    engine.features = frozenset({"embeddings"})
    engine.embed = lambda tokens: seen.append(list(tokens)) or list(given)
    return seen


def post(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


async def test_chat_completions_and_models_answer_without_the_v1_prefix() -> None:
    async with attached(SimWorker()):
        chat = await request("POST", "/chat/completions", chat_body(max_tokens=2), JSON)
        v1 = await request("POST", "/v1/chat/completions", chat_body(max_tokens=2), JSON)
        models = await request("GET", "/models")
        v1_models = await request("GET", "/v1/models")
    assert chat.status == 200, chat.body
    assert chat.json()["object"] == "chat.completion" and chat.json()["choices"][0]["message"]["content"] == v1.json()["choices"][0]["message"]["content"]
    assert chat.headers.get("x-request-id")
    assert models.status == 200 and models.json() == v1_models.json()
    assert [m["id"] for m in models.json()["data"]] == [MODEL]


async def test_chat_completions_without_v1_streams_as_the_v1_route() -> None:
    async with attached(SimWorker()):
        reply = await request("POST", "/chat/completions", chat_body(max_tokens=2, stream=True), JSON)
    assert reply.status == 200, reply.body
    frames = reply.sse_data()
    assert frames[-1] == "[DONE]" and json.loads(frames[0])["object"] == "chat.completion.chunk"


@pytest.mark.parametrize("route", ["/embedding", "/embeddings"])
async def test_native_embeddings_take_content_and_answer_llama_servers_array(route: str) -> None:
    async with attached(SimWorker()) as (link, _rt):
        seen = embedding_engine(link)
        one = await request("POST", route, post(content="hello"), JSON)
        two = await request("POST", route, post(input=["a", [1, 2, 3]]), JSON)
    assert one.status == 200, one.body
    assert one.json() == [{"index": 0, "embedding": [[0.6, -0.8, 0.0]]}]
    assert two.status == 200, two.body
    assert [item["index"] for item in two.json()] == [0, 1] and seen[-1] == [1, 2, 3]
    assert one.headers.get("x-request-id")


@pytest.mark.parametrize(
    ("norm", "expected"),
    [
        (2, [0.6, -0.8, 0.0]),
        (1, [0.6 / 1.4, -0.8 / 1.4, 0.0]),
        (0, [0.6 / 0.8 * 32760, -32760.0, 0.0]),
        (3, [v / (0.6**3 + 0.8**3) ** (1 / 3) for v in (0.6, -0.8, 0.0)]),
    ],
)
async def test_embd_normalize_is_llama_servers_norms(norm: int, expected: list[float]) -> None:
    async with attached(SimWorker()) as (link, _rt):
        embedding_engine(link)
        reply = await request("POST", "/embedding", post(content="hello", embd_normalize=norm), JSON)
    assert reply.status == 200, reply.body
    got = reply.json()[0]["embedding"][0]
    assert all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) for a, b in zip(got, expected, strict=True)), got


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({}, "content", "missing_required_parameter"),
        ({"content": ""}, "content", "invalid_value"),
        ({"content": 5}, "content", "invalid_type"),
        ({"input": []}, "input", "invalid_value"),
        ({"content": "x", "embd_normalize": -1}, "embd_normalize", "unsupported_parameter"),
        ({"content": "x", "embd_normalize": "2"}, "embd_normalize", "invalid_type"),
        ({"content": "x", "embd_normalize": -2}, "embd_normalize", "invalid_value"),
        ({"content": "x", "model": "nope"}, "model", "model_not_found"),
    ],
)
async def test_native_embeddings_refuse_bad_bodies_naming_the_field(body: dict[str, Any], param: str, code: str) -> None:
    async with attached(SimWorker()) as (link, _rt):
        embedding_engine(link)
        reply = await request("POST", "/embedding", post(**body), JSON)
    assert reply.status in (400, 404) and reply.is_error_object(), reply.body
    assert (reply.json()["error"]["param"], reply.json()["error"]["code"]) == (param, code)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
_fields = st.fixed_dictionaries({}, optional={"content": _json, "input": _json, "embd_normalize": _json, "model": _json, "encoding_format": _json})


def test_hostile_native_embeddings_bodies_are_answered_never_a_500() -> None:
    with attached_loop(SimWorker()) as loop:

        @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(body=_fields)
        def check(body: dict[str, Any]) -> None:
            reply = loop.run_until_complete(request("POST", "/embedding", json.dumps(body).encode(), JSON))
            assert reply.status < 500, reply.body
            if reply.status != 200:
                assert reply.is_error_object(), reply.body

        check()


# -- /chat/completions/input_tokens -----------------------------------------------------------

HI = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


@pytest.mark.parametrize("route", ["/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"])
async def test_input_tokens_answers_the_rendered_chats_count_in_llama_servers_shape(route: str) -> None:
    """llama-server's ``handle_count_tokens`` shape: the chat body rendered with the template and
    its tokens counted, nothing run (a plain chat: the rendered prompt's tokens)."""
    async with attached(SimWorker()):
        reply = await request("POST", route, post(messages=HI, max_tokens=5, stream=True), JSON)
        prompt = (await request("POST", "/apply-template", post(messages=HI), JSON)).json()["prompt"]
        tokens = (await request("POST", "/tokenize", post(content=prompt, add_special=True), JSON)).json()["tokens"]
    assert reply.status == 200, reply.body
    assert reply.json() == {"input_tokens": len(tokens), "object": "response.input_tokens"}
    assert len(tokens) > 5


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [({}, 400, "messages"), ({"messages": []}, 400, "messages"), ({"messages": HI, "model": "nope"}, 404, "model")],
)
async def test_input_tokens_refuses_what_a_chat_refuses(body: dict[str, Any], status: int, param: str) -> None:
    assert (await refused_count("/v1/chat/completions/input_tokens", body, status))["param"] == param


# -- llama-server's routes of features not served here ----------------------------------------


@pytest.mark.parametrize(
    ("method", "route"),
    [
        ("POST", "/rerank"),
        ("POST", "/reranking"),
        ("POST", "/v1/rerank"),
        ("POST", "/v1/reranking"),
        ("POST", "/props"),
        ("POST", "/slots/0?action=save"),
    ],
)
async def test_routes_of_features_not_served_are_llama_servers_501_not_a_404(method: str, route: str) -> None:
    """llama-server answers these 501 ``not_supported_error`` when the feature is not enabled
    (``--reranking``, ``--props``, ``--slot-save-path``); here they were 404s (405 for POST /props)."""
    async with attached(SimWorker()):
        reply = await request(method, route, post(query="q", documents=["a"], filename="x.bin"), JSON)
    assert reply.status == 501 and reply.is_error_object(), reply.body
    assert reply.json()["error"]["type"] == "not_supported_error"


async def test_props_still_answers_get() -> None:
    async with attached(SimWorker()):
        reply = await request("GET", "/props")
    assert reply.status == 200 and "default_generation_settings" in reply.json()


async def test_lora_adapters_is_llama_servers_with_no_adapter_loaded() -> None:
    async with attached(SimWorker()):
        listed = await request("GET", "/lora-adapters")
        applied = await request("POST", "/lora-adapters", json.dumps([{"id": 0, "scale": 0.5}]).encode(), JSON)
        bad = await request("POST", "/lora-adapters", post(id=0), JSON)
        junk = await request("POST", "/lora-adapters", b"[", JSON)
    assert listed.status == 200 and listed.json() == []
    assert applied.status == 200 and applied.json() == {"success": True}
    assert bad.status == 400 and bad.is_error_object()
    assert junk.status == 400 and junk.json()["error"]["code"] == "invalid_json"


def test_hostile_input_tokens_bodies_are_counted_or_refused_never_a_500() -> None:
    from tests.api.test_apply_template_hostile_s46 import _JSON, _MESSAGE, CASES

    with attached_loop(SimWorker()) as loop:
        for body in CASES:
            reply = loop.run_until_complete(request("POST", "/chat/completions/input_tokens", json.dumps(body).encode(), JSON))
            assert reply.status in (200, 400, 404), (reply.status, reply.body[:300])
            if reply.status == 200:
                assert isinstance(reply.json()["input_tokens"], int)
            else:
                assert reply.is_error_object(), reply.body

        @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(messages=st.lists(_MESSAGE, max_size=4), extra=st.dictionaries(st.sampled_from(["tools", "tool_choice", "chat_template_kwargs", "add_generation_prompt", "max_tokens", "stream", "n"]), _JSON, max_size=2))
        def check(messages: list[Any], extra: dict[str, Any]) -> None:
            body = json.dumps({"messages": messages, **extra}).encode()
            reply = loop.run_until_complete(request("POST", "/v1/chat/completions/input_tokens", body, JSON))
            assert reply.status in (200, 400), (reply.status, reply.body[:300])
            if reply.status == 400:
                assert reply.is_error_object() and reply.json()["error"]["param"], reply.body

        check()


CHATS = [
    HI,
    [{"role": "user", "content": "  spaced\n\ntext  "}, {"role": "assistant", "content": "ok."}, {"role": "user", "content": "again"}],
    [{"role": "user", "content": "quote <|im_end|> as text"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "\n"}],
]


@pytest.mark.model
@pytest.mark.parametrize("messages", CHATS)
async def test_input_tokens_is_the_count_the_worker_tokenises_the_chat_to(messages: list[dict[str, Any]]) -> None:
    """The bundled model's worker (its real engine) and this route read the same file: the count
    is the chat's ``usage.prompt_tokens``. The rendered prompt tokenised whole (llama-server's
    count) was a token off where a message's text begins with spaces, and counted control-token
    text written in a message as one control token, which the worker tokenises as text."""
    from contextlib import closing

    from scheduler.core.scheduler import SchedulerConfig
    from scheduler.engines.llama_cpp import LlamaCppEngine
    from scheduler.engines.models import default_model_path
    from scheduler.worker.loop import EngineWorker

    with closing(LlamaCppEngine(default_model_path(), n_lanes=1, lane_ctx=2048)) as engine:
        worker = EngineWorker(engine, SchedulerConfig(max_batch=1, lane_ctx=2048), model_name="m")
        tokens, *_ = worker._prompt_tokens({"endpoint": "chat", "messages": messages}, "")
    async with attached(SimWorker()):
        reply = await request("POST", "/chat/completions/input_tokens", post(messages=messages), JSON)
    assert reply.status == 200, reply.body
    assert reply.json()["input_tokens"] == len(tokens)


# -- on the shared real server (the bundled SmolLM2-135M, Q4_1) --------------------------------


@pytest.mark.e2e
@pytest.mark.model
def test_the_real_server_answers_llama_servers_routes(shared_server: Any) -> None:
    import httpx

    base = shared_server.base
    messages = [{"role": "user", "content": "  Name three colours."}]
    model = httpx.get(base + "/models", timeout=60).json()["data"][0]
    assert model["meta"]["n_embd"] == 576 and model["meta"]["ftype"] == "Q4_1" and model["meta"]["n_params"] > 0
    props = httpx.get(base + "/props", timeout=60).json()
    assert props["model_ftype"] == "Q4_1" and props["eos_token"] == "<|im_end|>"
    counted = httpx.post(base + "/v1/chat/completions/input_tokens", json={"messages": messages}, timeout=60)
    chat = httpx.post(base + "/chat/completions", json={"model": model["id"], "messages": messages, "max_tokens": 4}, timeout=120)
    assert counted.status_code == 200 and chat.status_code == 200, (counted.text, chat.text)
    assert counted.json()["input_tokens"] == chat.json()["usage"]["prompt_tokens"]
    native = httpx.post(base + "/embedding", json={"content": "a red fox"}, timeout=120)
    oai = httpx.post(base + "/v1/embeddings", json={"model": model["id"], "input": "a red fox"}, timeout=120)
    assert native.status_code == 200 and oai.status_code == 200, (native.text, oai.text)
    (vector,) = native.json()[0]["embedding"]
    assert len(vector) == 576 and vector == oai.json()["data"][0]["embedding"]


async def test_a_slot_path_other_than_a_post_is_still_the_unknown_route() -> None:
    async with attached(SimWorker()):
        reply = await request("GET", "/slots/0")
    assert reply.status == 404 and reply.json()["error"]["code"] == "not_found", reply.body
