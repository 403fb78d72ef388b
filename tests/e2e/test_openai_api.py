"""The OpenAI surface against the real server and model, through the official client and raw HTTP."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from .server import RunningServer, openai_client

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"
QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]


def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server.base)


def sse_events(response: httpx.Response) -> list[str]:
    return [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]


def test_models_lists_the_served_model_and_unknown_ids_are_404(server: RunningServer) -> None:
    c = client(server)
    assert [m.id for m in c.models.list()] == [MODEL]
    assert c.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as err:
        c.models.retrieve("no-such-model")
    assert err.value.code == "model_not_found"


def test_the_web_process_runs_on_uvloop(server: RunningServer) -> None:
    # serve's default loop (superfluid_site/eventloop.py): its banner names the loop daphne runs on
    assert "web loop:  uvloop" in server.log()


def test_chat_reply_through_the_official_client_answers_and_reports_usage(server: RunningServer) -> None:
    reply = client(server).chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=30)
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.prompt_tokens > 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streamed_greedy_chat_equals_the_unstreamed_reply(server: RunningServer) -> None:
    c = client(server)
    plain = c.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=40)
    chunks = list(
        c.chat.completions.create(
            model=MODEL, messages=QUESTION, temperature=0, max_tokens=40, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == plain.choices[0].message.content
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finish == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_the_responses_api_answers_as_the_chat_route_does(server: RunningServer) -> None:
    """POST /v1/responses (api/responses_api.py) through the client's ``responses.create`` and
    ``.stream`` on the real server and model: greedy, the Response's text is the chat reply's,
    streamed or not, with its usage."""
    c = client(server)
    chat = c.chat.completions.create(model=MODEL, messages=QUESTION, temperature=0, max_tokens=30)
    made = c.responses.create(model=MODEL, instructions=QUESTION[0]["content"], input=QUESTION[1]["content"], temperature=0, max_output_tokens=30)
    assert made.output_text == chat.choices[0].message.content and "Paris" in made.output_text
    assert made.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert (made.usage.input_tokens, made.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    with c.responses.stream(model=MODEL, instructions=QUESTION[0]["content"], input=QUESTION[1]["content"], temperature=0, max_output_tokens=30) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response() if made.status == "completed" else None
    assert "".join(deltas) == made.output_text
    assert final is None or final.output_text == made.output_text


def test_raw_sse_stream_starts_with_the_role_and_ends_with_done(server: RunningServer) -> None:
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "stream": True}
    with httpx.stream("POST", server.base + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    first = json.loads(events[0])
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert all("usage" not in json.loads(e) or json.loads(e)["usage"] is None for e in events[:-1])


def test_completions_streamed_and_not_agree_and_stop_at_max_tokens(server: RunningServer) -> None:
    c = client(server)
    plain = c.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=12)
    assert plain.choices[0].finish_reason == "length" and plain.usage.completion_tokens == 12
    streamed = "".join(
        ch.choices[0].text
        for ch in c.completions.create(model=MODEL, prompt="The capital of France is", temperature=0, max_tokens=12, stream=True)
        if ch.choices
    )
    assert streamed == plain.choices[0].text


def test_stop_strings_end_the_reply_before_the_stop_text(server: RunningServer) -> None:
    c = client(server)
    full = c.completions.create(model=MODEL, prompt="1, 2, 3, 4,", temperature=0, max_tokens=20).choices[0].text
    assert " 7" in full, full
    cut = c.completions.create(model=MODEL, prompt="1, 2, 3, 4,", temperature=0, max_tokens=20, stop=[" 7"])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[: full.index(" 7")]


def test_over_long_prompt_is_a_typed_context_length_error_before_any_stream(server: RunningServer) -> None:
    long_text = "hello " * 3000
    with pytest.raises(openai.BadRequestError) as err:
        client(server).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long_text}], stream=True)
    assert err.value.code == "context_length_exceeded"
    assert err.value.status_code == 400


def test_max_tokens_beyond_the_window_is_refused_up_front(server: RunningServer) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(server).chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5000)
    assert err.value.code == "context_length_exceeded"


@pytest.mark.parametrize(
    ("extra", "param"),
    [({"temperature": 5}, "temperature"), ({"top_p": 1.5}, "top_p"), ({"n": 17}, "n"), ({"logit_bias": {"9999999": 1}}, "logit_bias"),
     ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}}, "response_format")],
)
def test_bad_parameters_are_400_naming_the_param(server: RunningServer, extra: dict, param: str) -> None:
    r = httpx.post(server.base + "/v1/chat/completions", json={"model": MODEL, "messages": QUESTION, **extra}, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_unknown_model_is_404_and_invalid_json_is_400(server: RunningServer) -> None:
    r = httpx.post(server.base + "/v1/chat/completions", json={"model": "gpt-4", "messages": QUESTION}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(server.base + "/v1/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "error" in r.json()


def test_oversized_body_is_413(server: RunningServer) -> None:
    r = httpx.post(server.base + "/v1/completions", content=b"x" * (9 * 1024 * 1024), timeout=60)
    assert r.status_code == 413
    assert r.json()["error"]["code"] == "request_too_large"


def test_unknown_qos_class_is_400_and_changes_nothing(server: RunningServer) -> None:
    before = server.state()["stats"]["requests_total"]
    r = httpx.post(
        server.base + "/v1/chat/completions",
        json={"model": MODEL, "messages": QUESTION},
        headers={"x-superfluid-qos": "urgent"},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-superfluid-qos"
    assert server.state()["stats"]["requests_total"] == before
