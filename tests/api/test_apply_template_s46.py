"""llama-server's ``POST /apply-template``: a chat body rendered with the model's chat template
(as its worker renders a chat), without generating: ``{"prompt": text}``.

In process: the real application (the template read from the bundled model's file, as the
web process reads its vocabulary for /tokenize); one end-to-end check on the shared real
server that /completion of the rendered prompt is what /v1/chat/completions generates."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from django.test import override_settings

from keys.credentials import digest_of
from keys.runtime import Key, Policy
from tests.edge.inproc import JSON, SimWorker, attached, request

pytestmark_db = pytest.mark.django_db(transaction=True)

HI = [{"role": "user", "content": "hi"}]


def post(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


@pytestmark_db
async def test_apply_template_renders_the_chat_with_the_generation_prompt() -> None:
    async with attached(SimWorker()):
        reply = await request("POST", "/apply-template", post(messages=[{"role": "system", "content": "Be brief."}, *HI]), JSON)
        bare = await request("POST", "/apply-template", post(messages=HI, add_generation_prompt=False), JSON)
    assert reply.status == 200, reply.body
    prompt = reply.json()["prompt"]
    assert set(reply.json()) == {"prompt"}
    # the bundled model's own template (ChatML turns)
    assert prompt == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert bare.status == 200 and bare.json()["prompt"].endswith("<|im_start|>user\nhi<|im_end|>\n")


@pytestmark_db
async def test_tools_are_rendered_into_the_prompt_as_for_a_chat() -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    async with attached(SimWorker()):
        reply = await request("POST", "/apply-template", post(messages=HI, tools=[tool]), JSON)
    assert reply.status == 200, reply.body
    assert "get_weather" in reply.json()["prompt"]


@pytestmark_db
@pytest.mark.parametrize(
    ("fields", "status", "param"),
    [
        ({}, 400, "messages"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "user"}]}, 400, "messages[0].content"),
        ({"messages": HI, "add_generation_prompt": "yes"}, 400, "add_generation_prompt"),
        ({"messages": HI, "model": "nope"}, 404, "model"),
    ],
)
async def test_bad_bodies_are_errors_in_the_error_shape(fields: dict[str, Any], status: int, param: str) -> None:
    async with attached(SimWorker()):
        reply = await request("POST", "/apply-template", post(**fields), JSON)
    assert reply.status == status and reply.is_error_object(), reply.body
    assert reply.json()["error"]["param"] == param


@pytestmark_db
async def test_only_post_and_never_a_django_page() -> None:
    async with attached(SimWorker()):
        get = await request("GET", "/apply-template")
        junk = await request("POST", "/apply-template", b"{not json", JSON)
    assert get.status == 405 and get.is_error_object()
    assert junk.status == 400 and junk.json()["error"]["code"] == "invalid_json"


RESTRICTED, OPEN = "sf-restricted-0123456789", "sf-open-0123456789"


@pytestmark_db
@override_settings(SUPERFLUID_KEYS_REQUIRED=True)
async def test_keys_are_checked_as_for_tokenize() -> None:
    restricted = Key(id=1, name="restricted", digest=digest_of(RESTRICTED), policy=Policy(name="p", allowed_models=("other",)))
    everything = Key(id=2, name="open", digest=digest_of(OPEN), policy=Policy(name="q"))

    def keyed(secret: str) -> list[tuple[bytes, bytes]]:
        return [*JSON, (b"authorization", f"Bearer {secret}".encode())]

    async with attached(SimWorker(), keys={restricted.digest: restricted, everything.digest: everything}):
        missing = await request("POST", "/apply-template", post(messages=HI), JSON)
        other = await request("POST", "/apply-template", post(messages=HI), keyed(RESTRICTED))
        ok = await request("POST", "/apply-template", post(messages=HI), keyed(OPEN))
    assert missing.status == 401 and missing.is_error_object()
    assert other.status == 404 and other.json()["error"]["code"] == "model_not_found"
    assert ok.status == 200 and ok.json()["prompt"]


# -- the real server ----------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.model
def test_the_real_server_completion_of_the_applied_template_is_the_chat_reply(shared_server: Any) -> None:
    """llama-server's documented use: render the chat, then /completion it. At temperature 0
    the text is what /v1/chat/completions answers for the same messages."""
    messages = [{"role": "user", "content": "Name three colours."}]
    rendered = httpx.post(shared_server.base + "/apply-template", json={"messages": messages}, timeout=60)
    assert rendered.status_code == 200, rendered.text
    prompt = rendered.json()["prompt"]
    native = httpx.post(shared_server.base + "/completion", json={"prompt": prompt, "n_predict": 16, "temperature": 0}, timeout=120)
    model = httpx.get(shared_server.base + "/v1/models", timeout=60).json()["data"][0]["id"]
    chat = httpx.post(shared_server.base + "/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 16, "temperature": 0}, timeout=120)
    assert native.status_code == 200 and chat.status_code == 200, (native.text, chat.text)
    assert native.json()["content"] == chat.json()["choices"][0]["message"]["content"]
    assert native.json()["tokens_evaluated"] == chat.json()["usage"]["prompt_tokens"]


class StubVocab:
    def __init__(self, source: str) -> None:
        self.source = source

    def template_parts(self) -> tuple[str, str, str]:
        return self.source, "<s>", "</s>"


@pytestmark_db
@pytest.mark.parametrize(
    ("source", "status", "code"),
    [
        ("{{ raise_exception('Conversation roles must alternate') }}", 400, "invalid_messages"),  # the request's fault
        ("{% if %}", 500, None),  # the model's: its template does not compile
        ("{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{{ eos_token if not add_generation_prompt }}", 200, None),
    ],
)
async def test_the_templates_refusals_and_its_bos_and_eos(monkeypatch: pytest.MonkeyPatch, source: str, status: int, code: str | None) -> None:
    from api import views

    async def stub(model: str | None = None) -> StubVocab:
        return StubVocab(source)

    monkeypatch.setattr(views, "_vocab", stub)
    async with attached(SimWorker()):
        reply = await request("POST", "/apply-template", post(messages=HI), JSON)
        closed = await request("POST", "/apply-template", post(messages=HI, add_generation_prompt=False), JSON)
    assert reply.status == status, reply.body
    if status == 200:
        assert reply.json() == {"prompt": "<s>[user]hi"} and closed.json() == {"prompt": "<s>[user]hi</s>"}
    else:
        assert reply.is_error_object() and reply.json()["error"]["code"] == code


@pytestmark_db
async def test_a_template_without_a_system_role_gets_the_system_text_in_the_first_turn_as_a_chat_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gemma 2's template raises "System role not supported": the worker then opens the next
    turn with the system text (chat.merge_system_turn); /apply-template renders as the worker
    does, so it is that prompt, not a 400."""
    from pathlib import Path

    from api import views

    source = (Path(__file__).parent / "templates_s46" / "gemma-2-2b-it.jinja").read_text()

    async def stub(model: str | None = None) -> StubVocab:
        return StubVocab(source)

    monkeypatch.setattr(views, "_vocab", stub)
    async with attached(SimWorker()):
        reply = await request("POST", "/apply-template", post(messages=[{"role": "system", "content": "Be brief."}, *HI]), JSON)
    assert reply.status == 200, reply.body
    assert "Be brief.\nhi" in reply.json()["prompt"] and "system" not in reply.json()["prompt"]


@pytestmark_db
async def test_apply_template_takes_the_keys_rate_token_as_tokenize_does() -> None:
    """Rendering a body's worth of messages is work on the web process's threads, as
    /tokenize's is: a key at two requests a minute gets its third refused 429."""
    from scheduler.core.qos import QosClass

    secret = "sk-apply-rated-0123456789"
    keys = {digest_of(secret): Key(id=1, name="rated", digest=digest_of(secret), policy=Policy(name="r", max_class=QosClass.INTERACTIVE, rate_limit_rpm=2))}
    headers = [*JSON, (b"authorization", f"Bearer {secret}".encode())]
    async with attached(SimWorker(), keys=keys):
        replies = [await request("POST", "/apply-template", post(messages=HI), headers) for _ in range(3)]
    assert [r.status for r in replies] == [200, 200, 429], [r.body for r in replies]
    assert replies[2].json()["error"]["code"] == "rate_limit_exceeded"


@pytestmark_db
async def test_a_bad_body_costs_the_key_no_rate_token() -> None:
    """The body is checked before the key's token is taken, as a chat's is: a key at two requests
    a minute whose first /apply-template was malformed still has both."""
    from scheduler.core.qos import QosClass

    secret = "sk-apply-bad-0123456789"
    keys = {digest_of(secret): Key(id=1, name="rated", digest=digest_of(secret), policy=Policy(name="r", max_class=QosClass.INTERACTIVE, rate_limit_rpm=2))}
    headers = [*JSON, (b"authorization", f"Bearer {secret}".encode())]
    async with attached(SimWorker(), keys=keys):
        bad = await request("POST", "/apply-template", post(messages=[{"role": "user"}]), headers)
        good = [await request("POST", "/apply-template", post(messages=HI), headers) for _ in range(2)]
    assert bad.status == 400 and bad.json()["error"]["param"] == "messages[0].content", bad.body
    assert [r.status for r in good] == [200, 200], [r.body for r in good]
