"""What the installed ``openai`` package sends, fed to the parser: each body is captured from the
SDK itself over an ``httpx.MockTransport`` (no server, no network), so a parameter, message field
or content part the SDK can send is checked in exactly the JSON it sends it in."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from api.errors import ApiError
from api.schemas import GenerationRequest, parse_chat_request

MODELS = ("smollm2",)
USER: list[Any] = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


def sdk_chat_body(**kwargs: Any) -> bytes:
    """The body ``client.chat.completions.create(model="smollm2", **kwargs)`` sends."""
    sent: list[bytes] = []

    def respond(request: httpx.Request) -> httpx.Response:
        sent.append(request.content)
        return httpx.Response(400, json={"error": {"message": "captured", "type": "invalid_request_error"}})

    client = openai.OpenAI(api_key="k", base_url="http://sdk.test/v1", max_retries=0,
                           http_client=httpx.Client(transport=httpx.MockTransport(respond)))
    kwargs.setdefault("messages", USER)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="smollm2", **kwargs)
    assert len(sent) == 1
    return sent[0]


def sdk_chat(_strict: bool = False, **kwargs: Any) -> GenerationRequest:
    return parse_chat_request(sdk_chat_body(**kwargs), models=MODELS, strict=_strict)


def sdk_chat_error(_strict: bool = False, **kwargs: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        sdk_chat(_strict, **kwargs)
    assert info.value.status == 400, info.value
    return info.value


# -- modalities / audio --------------------------------------------------------------------------


@pytest.mark.parametrize("strict", [False, True])
def test_modalities_text_is_the_default_and_accepted_silently(strict: bool) -> None:
    """``modalities=["text"]`` asks for what every reply here is: it was named ignored, and a 400
    ``unknown_parameter`` under --strict-params."""
    req = sdk_chat(strict, modalities=["text"])
    assert req.ignored == []


@pytest.mark.parametrize("strict", [False, True])
def test_audio_output_is_refused_naming_it(strict: bool) -> None:
    """A client asking for spoken replies (``modalities`` with ``audio``, and ``audio``'s voice
    and format) would get text only and fail reading ``message.audio``: it was only named in
    the ignored-params header."""
    err = sdk_chat_error(strict, modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"})
    assert (err.param, err.code) == ("modalities", "unsupported_value")
    assert "audio" in err.message
    err = sdk_chat_error(strict, audio={"voice": "alloy", "format": "wav"})
    assert (err.param, err.code) == ("audio", "unsupported_parameter")
    assert sdk_chat_error(strict, modalities="text").param == "modalities"


# -- reasoning_effort, prediction, prompt_cache_options --------------------------------------------


def test_reasoning_effort_reaches_the_chat_template() -> None:
    """gpt-oss's chat template reads a ``reasoning_effort`` variable (vLLM and llama-server pass
    it there): it was dropped and named ignored."""
    req = sdk_chat(True, reasoning_effort="low")
    assert req.ignored == []
    assert req.chat_template_kwargs == {"reasoning_effort": "low"}
    # chat_template_kwargs' own value is the more specific one
    req = sdk_chat(reasoning_effort="low", extra_body={"chat_template_kwargs": {"reasoning_effort": "high", "x": 1}})
    assert req.chat_template_kwargs == {"reasoning_effort": "high", "x": 1}
    err = parse_chat_error({"reasoning_effort": 3})
    assert (err.param, err.code) == ("reasoning_effort", "invalid_type")


@pytest.mark.parametrize(
    "kwargs",
    [{"prediction": {"type": "content", "content": "print('hi')"}},
     {"prediction": {"type": "content", "content": [{"type": "text", "text": "print('hi')"}]}},
     {"prompt_cache_options": {"mode": "implicit", "ttl": "30m"}}],
    ids=["prediction", "prediction-parts", "prompt_cache_options"],
)
def test_hints_that_do_not_change_the_reply_are_accepted_silently(kwargs: dict[str, Any]) -> None:
    """A predicted output only speeds OpenAI up (the reply is the same), and prompt_cache_options
    is a cache hint like prompt_cache_retention: they were named ignored, and 400 under strict."""
    assert sdk_chat(True, **kwargs).ignored == []
    assert sdk_chat(False, **kwargs).ignored == []
    key = next(iter(kwargs))
    err = parse_chat_error({key: "x"})
    assert (err.param, err.code) == (key, "invalid_type")


# -- an assistant message sent back as the SDK returned it -----------------------------------------


def _reply() -> ChatCompletion:
    return ChatCompletion.model_validate({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "smollm2",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": None, "message": {
            "role": "assistant", "content": None, "refusal": None, "audio": None, "annotations": [],
            "function_call": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}],
    })


@pytest.mark.parametrize("strict", [False, True])
def test_the_sdks_own_reply_message_sent_back_is_accepted(strict: bool) -> None:
    """OpenAI's function-calling guide appends ``completion.choices[0].message`` to the messages:
    the SDK then sends its ``audio: null`` and ``annotations: []``, which were named ignored, and
    a 400 ``unknown_parameter`` under --strict-params."""
    message = _reply().choices[0].message
    req = sdk_chat(strict, tools=[TOOL], messages=[*USER, message, {"role": "tool", "tool_call_id": "c1", "content": "ok"}])
    assert req.ignored == []
    assert req.messages is not None
    assert req.messages[1]["tool_calls"][0]["id"] == "c1"


def test_an_earlier_audio_reply_is_dropped_and_named() -> None:
    """An assistant turn's ``audio`` (``{"id"}`` of audio OpenAI generated) cannot be heard here:
    it is dropped and named, in either mode, as the SDK may send it."""
    messages = [*USER, {"role": "assistant", "content": "x", "audio": {"id": "audio_1"}}, *USER]
    for strict in (False, True):
        assert sdk_chat(strict, messages=messages).ignored == ["messages.audio"]
    err = parse_chat_error({"messages": [*USER, {"role": "assistant", "content": "x", "audio": "a"}]})
    assert (err.param, err.code) == ("messages[1].audio", "invalid_type")


# -- custom tools: a clear 400 naming what is unsupported ------------------------------------------


def test_custom_tool_choice_and_custom_tool_calls_are_refused_naming_their_type() -> None:
    """The SDK's custom tools (free-text input) are not supported; a custom ``tool_choice`` was
    reported as a missing ``tool_choice.function.name``, and a custom tool call sent back as a
    missing ``function``."""
    err = sdk_chat_error(tools=[TOOL], tool_choice={"type": "custom", "custom": {"name": "f"}})
    assert (err.param, err.code) == ("tool_choice.type", "invalid_value")
    assert "custom" in err.message
    err = sdk_chat_error(tools=[{"type": "custom", "custom": {"name": "c"}}])
    assert (err.param, err.code) == ("tools[0].type", "invalid_value")
    assert "custom" in err.message
    call = {"id": "c1", "type": "custom", "custom": {"name": "c", "input": "raw"}}
    err = sdk_chat_error(messages=[*USER, {"role": "assistant", "tool_calls": [call]},
                                   {"role": "tool", "tool_call_id": "c1", "content": "ok"}])
    assert (err.param, err.code) == ("messages[1].tool_calls[0].type", "invalid_value")
    assert "custom" in err.message


# -- what already worked stays working (the SDK's spelling of each) --------------------------------


@pytest.mark.parametrize("strict", [False, True])
def test_sdk_parameters_that_are_honoured(strict: bool) -> None:
    req = sdk_chat(
        strict,
        messages=[{"role": "developer", "content": [{"type": "text", "text": "be brief"}], "name": "d"},
                  {"role": "user", "content": [{"type": "text", "text": "hi", "prompt_cache_breakpoint": {"mode": "explicit"}}],
                   "name": "bob"}],
        max_completion_tokens=7, stop=["\n", "END"], seed=5, n=2, logit_bias={"42": -100},
        logprobs=True, top_logprobs=3, user="u", metadata={"a": "b"}, store=False, service_tier="auto",
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True}},
        tools=[TOOL], tool_choice="required", parallel_tool_calls=False,
        stream=True, stream_options={"include_usage": True},
    )
    assert req.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert (req.max_tokens, req.stop, req.seed, req.n, req.logprobs) == (7, ["\n", "END"], 5, 2, 3)
    assert req.logit_bias == [[42, -100.0]]
    assert (req.tool_choice, req.parallel_tool_calls, req.include_usage) == ("required", False, True)
    assert req.response_format == {"type": "json_schema", "schema": {"type": "object"}, "strict": True}
    assert req.ignored == []


def parse_chat_error(body: dict[str, Any]) -> ApiError:
    """A body the SDK's types would not let through (a wrong type), sent as raw JSON."""
    body = {"model": "smollm2", "messages": USER, **body}
    with pytest.raises(ApiError) as info:
        parse_chat_request(json.dumps(body).encode(), models=MODELS)
    assert info.value.status == 400, info.value
    return info.value
