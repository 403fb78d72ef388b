"""Request parsing and validation (api.schemas): every rule, naming the offending param."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.errors import ApiError
from api.schemas import GenerationRequest, parse_chat_request, parse_completion_request
from scheduler.core.types import SamplingParams, seed32
from scheduler.link.messages import Submit, decode, encode

MODELS = ("smollm2", "other-model")
USER = [{"role": "user", "content": "hi"}]


def chat(_strict: bool = False, **body: Any) -> GenerationRequest:
    body.setdefault("model", "smollm2")
    body.setdefault("messages", USER)
    return parse_chat_request(json.dumps(body).encode(), models=MODELS, strict=_strict)


def completion(_strict: bool = False, **body: Any) -> GenerationRequest:
    body.setdefault("model", "smollm2")
    body.setdefault("prompt", "Once upon a time")
    return parse_completion_request(json.dumps(body).encode(), models=MODELS, strict=_strict)


def raw_chat_error(raw: bytes) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_chat_request(raw, models=MODELS)
    return info.value


def chat_error(**body: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        chat(**body)
    return info.value


def completion_error(**body: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        completion(**body)
    return info.value


def both_errors(**body: Any) -> list[ApiError]:
    """The error each endpoint raises for the same (shared) parameters."""
    return [chat_error(**body), completion_error(**body)]


def assert_400(err: ApiError, param: str | None, code: str | None = None) -> None:
    assert err.status == 400, err
    assert err.type == "invalid_request_error"
    assert err.param == param, err
    if code is not None:
        assert err.code == code, err


# -- body --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"not json", b'{"model": "smollm2",}', b"\xff\xfe\x00garbage", b'{"temperature": NaN}',
     b'{"temperature": Infinity}', b'{"temperature": 1e999}', b"[" * 100_000],
    ids=["empty", "truncated", "text", "trailing-comma", "bad-utf", "nan", "infinity", "overflow", "deep"],
)
def test_body_that_is_not_valid_json_is_rejected_as_invalid_json(raw: bytes) -> None:
    err = raw_chat_error(raw)
    assert_400(err, None, "invalid_json")
    assert err.message.startswith("We could not parse the JSON body of your request.")


@pytest.mark.parametrize("raw", [b"[]", b'"hello"', b"42", b"null"])
def test_body_that_is_json_but_not_an_object_is_rejected(raw: bytes) -> None:
    assert_400(raw_chat_error(raw), None, "invalid_type")


def test_a_body_that_starts_with_a_utf8_byte_order_mark_is_read_as_without_it() -> None:
    """Editors and PowerShell on Windows write one (``curl -d @body.json``); llama-server's parser
    skips it, as the batch JSONL reader here does. Only at the start: one later is JSON's error."""
    body = b'{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}'
    assert parse_chat_request(b"\xef\xbb\xbf" + body, models=MODELS) == parse_chat_request(body, models=MODELS)
    assert_400(raw_chat_error(b" \xef\xbb\xbf" + body), None, "invalid_json")


def test_completion_body_that_is_not_json_is_rejected() -> None:
    with pytest.raises(ApiError) as info:
        parse_completion_request(b"{", models=MODELS)
    assert_400(info.value, None, "invalid_json")


# -- model -------------------------------------------------------------------------------------


@pytest.mark.parametrize("parse", [parse_chat_request, parse_completion_request])
@pytest.mark.parametrize("model", [b"", b', "model": null', b', "model": ""'], ids=["absent", "null", "empty"])
def test_missing_model_is_rejected_naming_model(parse: Any, model: bytes) -> None:
    with pytest.raises(ApiError) as info:
        parse(b'{"messages": [], "prompt": "x"' + model + b"}", models=MODELS)
    assert_400(info.value, "model", "missing_required_parameter")
    assert info.value.message == "You must provide a model parameter."


@pytest.mark.parametrize("model", [3, ["smollm2"], True])
def test_model_that_is_not_a_string_is_rejected(model: Any) -> None:
    for err in both_errors(model=model):
        assert_400(err, "model", "invalid_type")


def test_unknown_model_is_404_model_not_found_in_openai_wording() -> None:
    for err in both_errors(model="gpt-9"):
        assert err.status == 404
        assert (err.type, err.param, err.code) == ("invalid_request_error", "model", "model_not_found")
        assert err.message == "The model `gpt-9` does not exist or you do not have access to it."


def test_any_served_model_is_accepted() -> None:
    assert chat(model="other-model").model == "other-model"
    assert completion(model="other-model").model == "other-model"


# -- unknown keys ------------------------------------------------------------------------------


def test_unknown_top_level_key_is_ignored_and_named() -> None:
    assert chat(frobnicate=1, mirostat=2).ignored == ["frobnicate", "mirostat"]
    assert completion(frobnicate={"x": [1]}).ignored == ["frobnicate"]
    assert chat().ignored == [] and completion().ignored == []


def test_strict_unknown_top_level_key_is_rejected_naming_it() -> None:
    for err in both_errors(_strict=True, frobnicate=1):
        assert_400(err, "frobnicate", "unknown_parameter")
        assert err.message == "Unrecognized request argument supplied: frobnicate"


@pytest.mark.parametrize("key", ["prompt", "suffix", "echo", "best_of"])
def test_completion_only_keys_are_unknown_on_chat(key: str) -> None:
    assert_400(chat_error(_strict=True, **{key: None}), key, "unknown_parameter")
    assert chat(**{key: None}).ignored == [key]


@pytest.mark.parametrize(
    ("key", "value", "field", "expected"),
    [("ignore_eos", True, "ignore_eos", True), ("repetition_penalty", 1.3, "repeat_penalty", 1.3),
     ("typical_p", 0.5, "typical_p", 0.5), ("top_k", -1, "top_k", 0), ("n_predict", 7, "max_tokens", 7),
     ("n_predict", -1, "max_tokens", None), ("min_p", 0.1, "min_p", 0.1), ("seed", 3, "seed", 3),
     ("presence_penalty", 1, "presence_penalty", 1.0), ("frequency_penalty", -1, "frequency_penalty", -1.0)],
)
def test_llama_server_and_vllm_parameters_are_honoured(key: str, value: Any, field: str, expected: Any) -> None:
    for req in (chat(_strict=True, **{key: value}), completion(_strict=True, **{key: value})):
        assert getattr(req, field) == expected and req.ignored == []


@pytest.mark.parametrize(("key", "value"), [("ignore_eos", 1), ("typical_p", 0), ("typical_p", 1.5),
                                            ("repetition_penalty", 0), ("n_predict", "5"), ("grammar", 3),
                                            ("json_schema", [1]), ("chat_template_kwargs", [])])
def test_known_extension_of_the_wrong_type_is_rejected_even_when_tolerant(key: str, value: Any) -> None:
    assert_400(chat_error(**{key: value}), key)


def test_chat_template_kwargs_are_kept() -> None:
    assert chat(chat_template_kwargs={"enable_thinking": False}).chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize(
    "key",
    ["messages", "top_logprobs", "tools", "tool_choice", "chat_template_kwargs",
     "parallel_tool_calls", "functions", "function_call"],
)
def test_chat_only_keys_are_unknown_on_completions(key: str) -> None:
    assert_400(completion_error(_strict=True, **{key: None}), key, "unknown_parameter")
    assert completion(**{key: None}).ignored == [key]


# -- chat messages -----------------------------------------------------------------------------


def test_minimal_chat_request_gets_defaults() -> None:
    req = chat()
    assert req == GenerationRequest(
        endpoint="chat", model="smollm2", messages=[{"role": "user", "content": "hi"}]
    )
    assert req.prompt is None and req.suffix is None and req.max_tokens is None
    assert req.sampling_dict() == {
        "temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": None,
        "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "typical_p": 1.0, "ignore_eos": False, "logit_bias": (), "logprobs": None,
    }
    assert SamplingParams(**req.sampling_dict()) == SamplingParams()
    assert (req.tools, req.tool_choice, req.response_format, req.logprobs) == (None, "auto", None, None)
    assert (req.stop, req.stream, req.include_usage, req.user) == ([], False, False, None)


def test_missing_messages_is_rejected() -> None:
    assert_400(chat_error(messages=None), "messages", "missing_required_parameter")


@pytest.mark.parametrize("messages", ["hi", {"role": "user"}, 3])
def test_messages_that_are_not_a_list_are_rejected(messages: Any) -> None:
    assert_400(chat_error(messages=messages), "messages", "invalid_type")


def test_empty_messages_list_is_rejected() -> None:
    assert_400(chat_error(messages=[]), "messages", "invalid_value")


def test_message_that_is_not_an_object_is_rejected_naming_its_index() -> None:
    assert_400(chat_error(messages=[*USER, "hello"]), "messages[1]", "invalid_type")


@pytest.mark.parametrize("role", ["robot", "", 3, "USER", "functions"])
def test_message_with_invalid_role_is_rejected(role: Any) -> None:
    err = chat_error(messages=[*USER, {"role": role, "content": "x"}])
    assert_400(err, "messages[1].role", "invalid_value")


def test_message_without_role_is_rejected() -> None:
    assert_400(chat_error(messages=[{"content": "x"}]), "messages[0].role", "missing_required_parameter")


@pytest.mark.parametrize("role", ["system", "user", "assistant", "tool"])
def test_each_supported_role_is_kept(role: str) -> None:
    assert chat(messages=[{"role": role, "content": "x"}]).messages == [{"role": role, "content": "x"}]


def test_developer_role_is_mapped_to_system() -> None:
    req = chat(messages=[{"role": "developer", "content": "be brief"}, *USER])
    assert req.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def test_text_content_parts_are_joined_one_a_line_as_llama_server_and_vllm_join_them() -> None:
    """Joined with nothing between them, a file sent as one part ran into the question sent as
    the next ("...return x" + "What does this do?" read "return xWhat does this do?")."""
    parts = [{"type": "text", "text": "def f(x):\n    return x"}, {"type": "text", "text": "What does this do?"}]
    assert chat(messages=[{"role": "user", "content": parts}]).messages == [
        {"role": "user", "content": "def f(x):\n    return x\nWhat does this do?"}
    ]
    # one part is its text as it came
    assert chat(messages=[{"role": "user", "content": parts[:1]}]).messages[0]["content"] == "def f(x):\n    return x"


def test_an_assistant_turns_refusal_part_is_read_as_its_text_and_refused_elsewhere() -> None:
    """OpenAI's assistant content is text or refusal parts (the openai package's
    ChatCompletionContentPartRefusalParam): a client sending a refusal back got a 400."""
    parts = [{"type": "text", "text": "No:"}, {"type": "refusal", "refusal": "I cannot help with that."}]
    req = chat(messages=[*USER, {"role": "assistant", "content": parts}, {"role": "user", "content": "ok"}])
    assert req.messages[1] == {"role": "assistant", "content": "No:\nI cannot help with that."}
    assert_400(chat_error(messages=[*USER, {"role": "assistant", "content": [{"type": "refusal", "refusal": 3}]}]),
               "messages[1].content[0].refusal", "invalid_type")
    # a refusal is the assistant's: on a user turn it is still an unsupported part
    assert_400(chat_error(messages=[{"role": "user", "content": [{"type": "refusal", "refusal": "x"}]}]),
               "messages[0].content", "unsupported_content")


@pytest.mark.parametrize(
    "part",
    [{"type": "image_url", "image_url": {"url": "http://x/y.png"}},
     {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
     {"type": "file", "file": {}}],
    ids=["image", "audio", "file"],
)
def test_non_text_content_part_is_unsupported_content_naming_the_message_content(part: Any) -> None:
    content = [{"type": "text", "text": "what is this?"}, part]
    err = chat_error(messages=[*USER, {"role": "user", "content": content}])
    assert_400(err, "messages[1].content", "unsupported_content")
    assert part["type"] in err.message


@pytest.mark.parametrize(
    ("content", "param", "code"),
    [
        ([], "messages[0].content", "invalid_value"),
        (["text"], "messages[0].content[0]", "invalid_type"),
        ([{"text": "x"}], "messages[0].content[0].type", "missing_required_parameter"),
        ([{"type": "text"}], "messages[0].content[0].text", "invalid_type"),
        ([{"type": "text", "text": 3}], "messages[0].content[0].text", "invalid_type"),
        (3, "messages[0].content", "invalid_type"),
        ({"type": "text", "text": "x"}, "messages[0].content", "invalid_type"),
    ],
)
def test_malformed_content_is_rejected_naming_the_exact_place(content: Any, param: str, code: str) -> None:
    assert_400(chat_error(messages=[{"role": "user", "content": content}]), param, code)


def test_null_content_is_allowed_for_assistant_as_empty_string() -> None:
    req = chat(messages=[*USER, {"role": "assistant", "content": None}, *USER])
    assert req.messages is not None and req.messages[1] == {"role": "assistant", "content": ""}


@pytest.mark.parametrize("role", ["system", "user", "developer", "tool"])
def test_null_or_missing_content_is_rejected_for_non_assistant_roles(role: str) -> None:
    assert_400(chat_error(messages=[{"role": role, "content": None}]), "messages[0].content",
               "missing_required_parameter")
    assert_400(chat_error(messages=[{"role": role}]), "messages[0].content", "missing_required_parameter")


def test_message_extras_sdks_echo_back_are_accepted_and_dropped() -> None:
    msgs = [
        {"role": "user", "content": "hi", "name": "ann"},
        {"role": "assistant", "content": "yo", "refusal": None, "tool_calls": [], "function_call": None},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]
    assert chat(messages=msgs).messages == [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
    ]


@pytest.mark.parametrize("key", ["tool_calls", "function_call"])
def test_assistant_message_with_tool_calls_is_kept_for_the_template(key: str) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    value = [call] if key == "tool_calls" else call["function"]
    (_, msg) = chat(messages=[*USER, {"role": "assistant", "content": None, key: value}]).messages
    assert msg["role"] == "assistant" and msg["content"] == ""
    assert msg["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}


def test_a_legacy_function_result_is_read_as_the_result_of_the_legacy_call_before_it() -> None:
    """The legacy conversation: the assistant's ``function_call``, then a ``function`` message
    with the result, is the tool call ``call_0`` and its tool result."""
    legacy = [*USER, {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": "{}"}},
              {"role": "function", "name": "f", "content": '{"sky": "sunny"}'}]
    (_, call, result) = chat(messages=legacy).messages
    assert call["tool_calls"][0]["id"] == "call_0"
    assert result == {"role": "tool", "content": '{"sky": "sunny"}', "name": "f", "tool_call_id": "call_0"}
    # after calls with ids of their own (tool_calls), the result answers the call of its name; null content is ""
    mixed = [*USER, {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_x", "type": "function", "function": {"name": "g", "arguments": "{}"}},
                {"id": "call_y", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
             {"role": "function", "name": "f", "content": None}]
    assert chat(messages=mixed).messages[2] == {"role": "tool", "content": "", "name": "f", "tool_call_id": "call_y"}
    # after an assistant turn without a call (the fuzzer's find: it was a 500), the legacy call id
    plain = [*USER, {"role": "assistant", "content": None}, {"role": "function", "name": "f", "content": "1"}]
    assert chat(messages=plain).messages[2]["tool_call_id"] == "call_0"
    assert_400(chat_error(messages=[*USER, {"role": "function", "name": "f", "content": "1", "function_call": {"name": "f"}}]),
               "messages[1].function_call", "invalid_value")
    assert_400(chat_error(messages=[*USER, {"role": "function", "content": "1"}]), "messages[1].name", "missing_required_parameter")
    assert_400(chat_error(messages=[*USER, {"role": "function", "name": "f"}]), "messages[1].content", "missing_required_parameter")


def test_legacy_functions_ask_for_a_legacy_reply_of_one_call() -> None:
    legacy = chat(functions=[TOOL["function"]], function_call="auto")
    assert legacy.legacy_functions and not legacy.parallel_tool_calls
    assert legacy.tools == [{"name": "f", "description": "d", "parameters": TOOL["function"]["parameters"]}]
    tools = chat(tools=[TOOL])
    assert not tools.legacy_functions and tools.parallel_tool_calls
    assert not chat(functions=[]).legacy_functions  # no functions: a plain reply
    # both spellings: the current one is used, the legacy one named as ignored (it was dropped silently)
    both = chat(tools=[TOOL], functions=[{"name": "g"}], tool_choice="auto", function_call={"name": "nowhere"})
    assert [t["name"] for t in both.tools or []] == ["f"] and not both.legacy_functions and both.tool_choice == "auto"
    assert both.ignored == ["functions", "function_call"]


@pytest.mark.parametrize(
    ("calls", "param"),
    [("x", "messages[1].tool_calls"), ([3], "messages[1].tool_calls[0]"),
     ([{"function": {"arguments": "{}"}}], "messages[1].tool_calls[0].function.name"),
     ([{"function": {"name": "f", "arguments": 3}}], "messages[1].tool_calls[0].function.arguments"),
     ([{}], "messages[1].tool_calls[0].function")],
)
def test_malformed_tool_calls_in_history_are_rejected_naming_them(calls: Any, param: str) -> None:
    assert_400(chat_error(messages=[*USER, {"role": "assistant", "content": None, "tool_calls": calls}]), param)


def test_tool_calls_on_a_user_message_are_rejected() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    assert_400(chat_error(messages=[{"role": "user", "content": "x", "tool_calls": [call]}]),
               "messages[0].tool_calls", "invalid_value")


def test_an_unknown_message_key_is_ignored_and_named_or_with_strict_rejected_naming_it() -> None:
    """OpenAI accepts keys of a client's own on a message (CodeCompanion's id and opts; a
    reasoning model's reasoning_content sent back): they were a 400 here. ``audio: null`` is
    the SDK's own key (a reply sent back as it came) and carries nothing: dropped unnamed.
    ``reasoning_content`` is read (the template may write it: tests/api/test_reasoning_s47.py)."""
    messages = [{"role": "user", "content": "x", "id": 1947269257, "opts": {"visible": False}},
                {"role": "assistant", "content": "y", "reasoning_content": "...", "audio": None},
                {"role": "user", "content": "z", "id": 2}]
    req = chat(messages=messages)
    assert req.messages == [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "reasoning_content": "..."}, {"role": "user", "content": "z"}]
    assert req.ignored == ["messages.id", "messages.opts"]
    err = chat_error(_strict=True, messages=[{"role": "user", "content": "x", "mood": "happy"}])
    assert_400(err, "messages[0].mood", "unknown_parameter")


def test_message_name_that_is_not_a_string_is_rejected() -> None:
    assert_400(chat_error(messages=[{"role": "user", "content": "x", "name": 3}]), "messages[0].name",
               "invalid_type")


# -- chat-only parameters ----------------------------------------------------------------------


TOOL = {"type": "function", "function": {"name": "f", "description": "d",
                                          "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}


@pytest.mark.parametrize(
    ("body", "choice"),
    [({"tools": [TOOL]}, "auto"), ({"tools": [TOOL], "tool_choice": "required"}, "required"),
     ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}}, {"name": "f"}),
     ({"tools": [TOOL], "tool_choice": "none"}, "none"),
     ({"functions": [TOOL["function"]], "function_call": {"name": "f"}}, {"name": "f"})],
)
def test_tools_and_tool_choice_are_normalised(body: dict[str, Any], choice: Any) -> None:
    req = chat(_strict=True, **body)
    assert req.tools == [{"name": "f", "description": "d", "parameters": TOOL["function"]["parameters"]}]
    assert req.tool_choice == choice


@pytest.mark.parametrize(
    ("body", "param"),
    [({"tools": "x"}, "tools"), ({"tools": [{"type": "function"}]}, "tools[0].function"),
     ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
     ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
     # OpenAI's pattern: the name is written back into the call markup verbatim
     ({"tools": [TOOL, {"type": "function", "function": {"name": "get weather"}}]}, "tools[1].function.name"),
     ({"tools": [{"type": "function", "function": {"name": 'f"}, {"name": "g'}}]}, "tools[0].function.name"),
     ({"tools": [{"type": "function", "function": {"name": "f" * 65}}]}, "tools[0].function.name"),
     ({"functions": [{"name": "f\n</tool_call>"}]}, "functions[0].name"),
     ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
     ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
     ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
     ({"tool_choice": "required"}, "tool_choice"),
     ({"tools": [TOOL], "grammar": 'root ::= "x"'}, "grammar")],
)
def test_malformed_tools_are_rejected_naming_the_param(body: dict[str, Any], param: str) -> None:
    assert_400(chat_error(**body), param)


TOOL_G = {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize("mode", ["auto", "required"])
def test_allowed_tools_tool_choice_offers_only_the_allowed_functions_in_its_mode(mode: str) -> None:
    """OpenAI's ``{"type": "allowed_tools", ...}`` tool_choice (in the openai package's types):
    it was a 400 naming a missing ``tool_choice.function.name``."""
    choice = {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": [{"type": "function", "function": {"name": "g"}}]}}
    req = chat(_strict=True, tools=[TOOL, TOOL_G], tool_choice=choice)
    assert [t["name"] for t in req.tools or []] == ["g"] and req.tool_choice == mode


@pytest.mark.parametrize(
    ("allowed", "param"),
    [(None, "tool_choice.allowed_tools"),
     ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice.allowed_tools.mode"),
     ({"mode": "none", "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice.allowed_tools.mode"),
     ({"mode": "auto"}, "tool_choice.allowed_tools.tools"),
     ({"mode": "auto", "tools": []}, "tool_choice.allowed_tools.tools"),
     ({"mode": "auto", "tools": [{"type": "function", "function": {"name": "h"}}]}, "tool_choice.allowed_tools.tools[0].function.name"),
     ({"mode": "auto", "tools": [{"type": "function"}]}, "tool_choice.allowed_tools.tools[0].function.name")],
)
def test_a_malformed_allowed_tools_tool_choice_is_a_400_naming_its_field(allowed: Any, param: str) -> None:
    assert_400(chat_error(tools=[TOOL, TOOL_G], tool_choice={"type": "allowed_tools", "allowed_tools": allowed}), param)


@pytest.mark.parametrize(
    ("body", "expected"),
    [({"response_format": {"type": "json_object"}}, {"type": "json_object"}),
     ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"},
                                                                   "strict": True}}},
      {"type": "json_schema", "schema": {"type": "object"}, "strict": True}),
     ({"response_format": {"type": "text"}}, None),
     ({"json_schema": {"type": "integer"}}, {"type": "json_schema", "schema": {"type": "integer"}, "strict": True}),
     ({"guided_json": '{"type": "integer"}'}, {"type": "json_schema", "schema": {"type": "integer"}, "strict": True}),
     ({"grammar": 'root ::= "a"'}, {"type": "grammar", "grammar": 'root ::= "a"'})],
)
def test_structured_output_forms_are_normalised(body: dict[str, Any], expected: Any) -> None:
    assert chat(_strict=True, **body).response_format == expected
    assert completion(_strict=True, **body).response_format == expected


@pytest.mark.parametrize(
    ("body", "param"),
    [({"response_format": "json"}, "response_format"), ({"response_format": {"type": "yaml"}}, "response_format.type"),
     ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
     ({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}}, "response_format.json_schema.schema"),
     ({"response_format": {"type": "json_schema", "json_schema": {"schema": False}}}, "response_format.json_schema.schema"),
     ({"response_format": {"type": "json_object"}, "grammar": "root ::= x"}, "grammar")],
)
def test_malformed_structured_output_is_rejected_naming_the_param(body: dict[str, Any], param: str) -> None:
    assert_400(chat_error(**body), param)


@pytest.mark.parametrize(
    ("bias", "expected"),
    [({"50256": -100}, [[50256, -100.0]]), ({"1": 5, "2": -0.5}, [[1, 5.0], [2, -0.5]]),
     ([[7, False]], [[7, -100.0]]), ([[7, 3]], [[7, 3.0]]), ({}, []), (None, [])],
)
def test_logit_bias_is_parsed(bias: Any, expected: Any) -> None:
    assert chat(logit_bias=bias).logit_bias == expected
    assert completion(logit_bias=bias).logit_bias == expected


@pytest.mark.parametrize("bias", [{"x": 1}, {"-1": 1}, {"1": 101}, {"1": "5"}, {"1": True}, [[1]], 3])
def test_malformed_logit_bias_is_rejected(bias: Any) -> None:
    for err in both_errors(logit_bias=bias):
        assert_400(err, "logit_bias")


@pytest.mark.parametrize(
    ("key", "value"),
    [("tools", None), ("tools", []), ("tool_choice", None), ("tool_choice", "none"), ("functions", []),
     ("function_call", "none"), ("response_format", {"type": "text"}), ("response_format", None),
     ("logit_bias", {}), ("logit_bias", None), ("parallel_tool_calls", True),
     ("parallel_tool_calls", False), ("user", "u-1"), ("logit_bias", {"50256": -100}), ("metadata", {"k": "v"}), ("store", False),
     ("service_tier", "auto"), ("cache_prompt", True), ("logprobs", False), ("logprobs", None),
     ("top_logprobs", None), ("n", 1), ("n", None)],
)
def test_harmless_chat_parameter_is_accepted(key: str, value: Any) -> None:
    chat(**{key: value})


@pytest.mark.parametrize(
    ("key", "value"),
    [("parallel_tool_calls", "yes"), ("metadata", "x"), ("store", 1), ("service_tier", 1),
     ("cache_prompt", "yes"), ("user", 3), ("logit_bias", [1])],
)
def test_accepted_but_ignored_parameter_of_the_wrong_type_is_rejected(key: str, value: Any) -> None:
    assert_400(chat_error(**{key: value}), key, "invalid_type")


def test_user_is_kept() -> None:
    assert chat(user="alice").user == "alice"
    assert completion(user="bob").user == "bob"


@pytest.mark.parametrize(
    ("body", "expected"),
    [({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 3}, 3), ({"logprobs": True, "top_logprobs": 20}, 20),
     ({"logprobs": False}, None), ({}, None)],
)
def test_chat_logprobs_are_parsed(body: dict[str, Any], expected: Any) -> None:
    assert chat(**body).logprobs == expected


@pytest.mark.parametrize(
    ("body", "param"),
    [({"logprobs": 1}, "logprobs"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
     ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"), ({"top_logprobs": 3}, "top_logprobs")],
)
def test_bad_chat_logprobs_are_rejected(body: dict[str, Any], param: str) -> None:
    assert_400(chat_error(**body), param)


@pytest.mark.parametrize(
    ("body", "expected"),
    [({"max_tokens": 7}, 7), ({"max_completion_tokens": 9}, 9),
     ({"max_tokens": 5, "max_completion_tokens": 5}, 5),
     ({"max_tokens": None, "max_completion_tokens": 3}, 3)],
)
def test_both_endpoints_accept_max_tokens_or_max_completion_tokens(body: dict[str, Any], expected: int) -> None:
    """Completions ignored max_completion_tokens (named in the ignored header), though
    docs/api.md lists it for both endpoints."""
    assert chat(**body).max_tokens == expected
    for strict in (False, True):
        req = completion(_strict=strict, **body)
        assert (req.max_tokens, req.ignored) == (expected, [])


def test_max_tokens_and_max_completion_tokens_that_disagree_are_rejected_on_both_endpoints() -> None:
    for err in both_errors(max_tokens=5, max_completion_tokens=6):
        assert_400(err, "max_completion_tokens", "invalid_value")


@pytest.mark.parametrize("value", [-1, 5.0, "5", True])
def test_invalid_max_completion_tokens_is_rejected_naming_it(value: Any) -> None:
    for err in both_errors(max_completion_tokens=value):
        assert_400(err, "max_completion_tokens")


@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
def test_a_limit_of_zero_is_the_prompt_alone_on_completions_and_refused_on_chat(param: str) -> None:
    # OpenAI's legacy endpoint takes 0 (echo + logprobs: the prompt scored, nothing generated)
    assert completion(**{param: 0}).max_tokens == 0
    err = chat_error(**{param: 0})
    assert_400(err, param, "invalid_value")
    assert err.message == f"Invalid value for '{param}': expected an integer greater than or equal to 1."
    err = completion_error(**{param: -1})
    assert_400(err, param, "invalid_value")
    assert err.message == f"Invalid value for '{param}': expected an integer greater than or equal to 0."
    # fill-in-the-middle has nothing to give without its middle
    assert_400(completion_error(suffix="x", **{param: 0}), param, "invalid_value")


def test_max_completion_tokens_takes_the_place_of_n_predict_as_max_tokens_does() -> None:
    assert completion(max_completion_tokens=4, n_predict=9).max_tokens == 4
    assert chat(max_completion_tokens=4, n_predict=9).max_tokens == 4


# -- completions prompt ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("hello", "hello"), ("", ""), (["hello"], "hello"), ([1, 2, 3], [1, 2, 3]), ([0], [0]),
     ([[4, 5]], [4, 5])],
    ids=["string", "empty-string", "list-of-one-string", "token-ids", "token-zero", "list-of-one-token-list"],
)
def test_each_supported_prompt_form_is_normalised(prompt: Any, expected: Any) -> None:
    req = completion(prompt=prompt)
    assert req.prompt == expected
    assert req.endpoint == "completions" and req.messages is None


def test_minimal_completion_request_gets_defaults() -> None:
    req = completion()
    assert req == GenerationRequest(endpoint="completions", model="smollm2", prompt="Once upon a time")


def test_missing_prompt_is_rejected() -> None:
    assert_400(completion_error(prompt=None), "prompt", "missing_required_parameter")


@pytest.mark.parametrize("prompt", [["a", "b"], [[1], [2]], ["a", [5, 6], "c"]])
def test_several_prompts_become_one_choice_each_in_order(prompt: Any) -> None:
    req = completion(prompt=prompt)
    assert req.prompts == prompt and req.prompt == prompt[0]
    assert [c.prompt for c in req.choices()] == prompt
    assert all(c.n == 1 and c.prompts is None for c in req.choices())


def test_choices_are_ordered_prompt_by_prompt_n_each_with_distinct_seeds() -> None:
    req = completion(prompt=["a", "b"], n=3, seed=7)
    choices = req.choices()
    assert [c.prompt for c in choices] == ["a", "a", "a", "b", "b", "b"]
    assert [c.seed for c in choices] == [7, 8, 9, 7, 8, 9]
    assert [c.seed for c in completion(n=2).choices()] == [None, None]
    # wraps in int64, passing over 2**63 - 1, whose low 32 bits are all ones (random)
    assert [c.seed for c in completion(n=3, seed=2**63 - 2).choices()] == [2**63 - 2, -(2**63), -(2**63) + 1]


def test_no_choice_after_the_first_gets_a_seed_read_as_random() -> None:
    """Choice j samples with seed + j: seed 4294967294's second choice got 4294967295, which both
    engines read as llama.cpp's random seed, so that choice changed on every run of the same
    request (docs/api.md: the same request gives the same choices)."""
    seeds = [c.seed for c in completion(n=3, seed=2**32 - 2).choices()]
    assert seeds == [2**32 - 2, 2**32, 2**32 + 1]
    assert all(seed32(s) is not None for s in seeds)


def test_seed_minus_one_leaves_every_choice_random_not_only_the_first() -> None:
    """``seed: -1`` (llama-server's "random"; any seed whose low 32 bits are all ones, which both
    engines read as llama.cpp's LLAMA_DEFAULT_SEED) gave choice 0 a random draw but choices 1 and
    2 the fixed seeds 0 and 1: the same two replies on every "regenerate"."""
    for seed in (-1, 2**32 - 1, 2**63 - 1):
        assert [c.seed for c in completion(n=3, seed=seed).choices()] == [None, None, None]


def test_a_single_prompt_in_a_list_is_just_that_prompt() -> None:
    assert completion(prompt=["x"]).prompts is None and completion(prompt=["x"]).prompt == "x"
    assert completion(prompt=[[1, 2]]).prompt == [1, 2]


def test_too_many_prompts_or_choices_are_refused_naming_the_bound() -> None:
    err = completion_error(prompt=["a"] * 33)
    assert_400(err, "prompt", "invalid_value")
    assert "32" in err.message
    completion(prompt=["a"] * 32)
    err = completion_error(prompt=["a"] * 3, n=11)
    assert_400(err, "n", "invalid_value")
    assert "33" in err.message and "32" in err.message


@pytest.mark.parametrize(
    "prompt",
    [[], [[]], [-1], [1, -2], [[3, -1]], [1.0], [True], ["a", 1], [1, "a"], [[1, "a"]], [None], 3, {"a": 1}],
)
def test_malformed_prompt_is_rejected(prompt: Any) -> None:
    assert_400(completion_error(prompt=prompt), "prompt")


def test_suffix_is_kept_for_fill_in_the_middle() -> None:
    assert completion(suffix="return x").suffix == "return x"
    assert completion(suffix=None).suffix is None


def test_suffix_that_is_not_a_string_is_rejected() -> None:
    assert_400(completion_error(suffix=3), "suffix", "invalid_type")


@pytest.mark.parametrize(("key", "value"), [("best_of", 2), ("best_of", 1.0)])
def test_unsupported_completion_options_are_rejected_naming_them(key: str, value: Any) -> None:
    assert_400(completion_error(**{key: value}), key, "unsupported_value")


def test_echo_is_a_boolean() -> None:
    assert completion(echo=True).echo is True and completion(echo=None).echo is False
    assert_400(completion_error(echo=0), "echo", "invalid_type")
    assert_400(completion_error(echo="yes"), "echo", "invalid_type")


@pytest.mark.parametrize(
    ("key", "value"),
    [("echo", False), ("echo", None), ("best_of", 1), ("best_of", None), ("logprobs", 0), ("logprobs", None),
     ("logit_bias", {}), ("cache_prompt", False), ("user", "u"), ("logprobs", 5), ("logprobs", 20)],
)
def test_harmless_completion_options_are_accepted(key: str, value: Any) -> None:
    completion(**{key: value})


@pytest.mark.parametrize(("key", "value"), [("metadata", {"k": "v"}), ("store", False), ("service_tier", "auto"), ("metadata", None)])
def test_metadata_store_and_service_tier_are_accepted_silently_on_completions_as_on_chat(key: str, value: Any) -> None:
    """They were named as ignored (x-superfluid-ignored-params) and, under --strict-params,
    refused as unknown on completions, though OpenAI's completions take them as chat does."""
    for strict in (False, True):
        assert completion(_strict=strict, **{key: value}).ignored == []
        assert chat(_strict=strict, **{key: value}).ignored == []


@pytest.mark.parametrize(("key", "value"), [("prompt_cache_key", "agent-7"), ("safety_identifier", "u-hash"), ("prompt_cache_retention", "24h")])
def test_the_replacements_of_user_are_accepted_silently_on_chat_and_checked_for_their_type(key: str, value: str) -> None:
    """OpenAI deprecated chat's ``user`` for ``safety_identifier`` and ``prompt_cache_key``: they
    were named as ignored and, under --strict-params, refused as unknown, where ``user`` is not."""
    for strict in (False, True):
        assert chat(_strict=strict, **{key: value}).ignored == []
    assert_400(chat_error(**{key: 3}), key, "invalid_type")


@pytest.mark.parametrize(("key", "value"), [("metadata", "x"), ("store", 1), ("service_tier", 1)])
def test_metadata_store_and_service_tier_of_the_wrong_type_are_400_on_completions_as_on_chat(key: str, value: Any) -> None:
    for err in both_errors(**{key: value}):
        assert_400(err, key, "invalid_type")


@pytest.mark.parametrize("value", [21, -1, True, 1.0])
def test_bad_completion_logprobs_are_rejected(value: Any) -> None:
    assert_400(completion_error(logprobs=value), "logprobs")


# -- sampling parameters (both endpoints) ------------------------------------------------------

# (param, valid values with what they parse to, invalid values, expected-range wording)
NUMERIC_PARAMS: list[tuple[str, list[tuple[Any, Any]], list[Any], str]] = [
    ("temperature", [(0, 0.0), (0.7, 0.7), (2, 2.0)], [-0.1, 2.01, 3, "1", True, [1]],
     "expected a number between 0 and 2"),
    ("top_p", [(1, 1.0), (0.01, 0.01), (0, 0.0)], [-0.5, -0.01, 1.5, "0.9", False],
     "expected a number between 0 and 1"),
    ("top_k", [(0, 0), (40, 40)], [-2, 4.0, 1.5, "40", True],
     "expected an integer greater than or equal to -1"),
    ("min_p", [(0, 0.0), (0.05, 0.05), (1, 1.0)], [-0.01, 1.01, "0.1", True],
     "expected a number between 0 and 1"),
    ("seed", [(0, 0), (-5, -5), (2**63 - 1, 2**63 - 1)], [1.0, "7", True, 2**63, -(2**63) - 1],
     "expected a 64-bit integer"),
    ("presence_penalty", [(-2, -2.0), (0.5, 0.5), (2, 2.0)], [-2.1, 2.1, "0", True],
     "expected a number between -2 and 2"),
    ("frequency_penalty", [(-2, -2.0), (1.5, 1.5), (2, 2.0)], [-3, 2.5, "1", False],
     "expected a number between -2 and 2"),
    ("repeat_penalty", [(1.1, 1.1), (0.5, 0.5), (3, 3.0)], [0, -1, "1.1", True],
     "expected a number greater than 0"),
    # (0 is refused on chat alone: test_a_limit_of_zero_is_the_prompt_alone_on_completions_and_refused_on_chat)
    ("max_tokens", [(1, 1), (256, 256)], [], "expected an integer greater than or equal to 1"),
]

VALID_NUMERIC = [(p, v, out) for p, valids, _, _ in NUMERIC_PARAMS for v, out in valids]
INVALID_NUMERIC = [(p, v, msg) for p, _, invalids, msg in NUMERIC_PARAMS for v in invalids]


@pytest.mark.parametrize(("param", "value", "expected"), VALID_NUMERIC)
def test_in_range_sampling_value_is_accepted_on_both_endpoints(param: str, value: Any, expected: Any) -> None:
    for req in (chat(**{param: value}), completion(**{param: value})):
        got = getattr(req, param)
        assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(("param", "value", "wording"), INVALID_NUMERIC)
def test_out_of_range_or_wrong_type_sampling_value_is_rejected_naming_the_param(
    param: str, value: Any, wording: str
) -> None:
    for err in both_errors(**{param: value}):
        assert_400(err, param)
        assert err.code in ("invalid_type", "invalid_value")
        assert err.message == f"Invalid value for '{param}': {wording}."


def test_temperature_above_two_is_rejected_naming_the_param() -> None:
    err = chat_error(temperature=2.5)
    assert_400(err, "temperature", "invalid_value")
    assert err.message == "Invalid value for 'temperature': expected a number between 0 and 2."


def test_boolean_temperature_is_not_a_number() -> None:
    assert_400(chat_error(temperature=True), "temperature", "invalid_type")


def test_integral_float_max_tokens_is_not_an_integer() -> None:
    assert_400(completion_error(max_tokens=5.0), "max_tokens", "invalid_type")


@pytest.mark.parametrize("param", [p for p, *_ in NUMERIC_PARAMS])
def test_null_sampling_value_means_default(param: str) -> None:
    assert getattr(chat(**{param: None}), param) == getattr(chat(), param)


def test_sampling_dict_feeds_scheduler_sampling_params() -> None:
    req = chat(temperature=0.2, top_p=0.9, top_k=40, min_p=0.05, seed=7, repeat_penalty=1.1,
               presence_penalty=0.5, frequency_penalty=-0.5)
    assert SamplingParams(**req.sampling_dict()) == SamplingParams(
        temperature=0.2, top_p=0.9, top_k=40, min_p=0.05, seed=7, repeat_penalty=1.1,
        presence_penalty=0.5, frequency_penalty=-0.5,
    )


@pytest.mark.parametrize(
    ("stop", "expected"),
    [(None, []), ("\n", ["\n"]), ([], []), (["a"], ["a"]), (["a", "b", "c", "d"], ["a", "b", "c", "d"]),
     ([str(i) for i in range(16)], [str(i) for i in range(16)])],
)
def test_stop_is_normalised_to_a_list(stop: Any, expected: list[str]) -> None:
    assert chat(stop=stop).stop == expected
    assert completion(stop=stop).stop == expected


@pytest.mark.parametrize(
    ("stop", "code"),
    [(["a"] * 17, "invalid_value"), ("", "invalid_value"), (["a", ""], "invalid_value"),
     ([1], "invalid_value"), (["a", None], "invalid_value"), (3, "invalid_type"), ({"a": 1}, "invalid_type")],
)
def test_invalid_stop_is_rejected(stop: Any, code: str) -> None:
    for err in both_errors(stop=stop):
        assert_400(err, "stop", code)


@pytest.mark.parametrize(("n", "code"), [(0, "invalid_value"), (17, "invalid_value"), (-1, "invalid_value"),
                                         (1.0, "invalid_type"), ("1", "invalid_type"), (True, "invalid_type")])
def test_n_outside_1_to_16_or_not_an_integer_is_rejected(n: Any, code: str) -> None:
    for err in both_errors(n=n):
        assert_400(err, "n", code)
        assert "16" in err.message


@pytest.mark.parametrize("n", [1, 2, 16])
def test_n_up_to_16_gives_that_many_choices(n: int) -> None:
    assert len(chat(n=n).choices()) == n
    assert len(completion(n=n).choices()) == n
    assert chat(n=None).n == 1


# -- streaming ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("stream", "expected"), [(True, True), (False, False), (None, False)])
def test_stream_flag_is_parsed(stream: Any, expected: bool) -> None:
    assert chat(stream=stream).stream is expected
    assert completion(stream=stream).stream is expected


@pytest.mark.parametrize("stream", ["true", 1, 0])
def test_stream_that_is_not_a_boolean_is_rejected(stream: Any) -> None:
    for err in both_errors(stream=stream):
        assert_400(err, "stream", "invalid_type")


@pytest.mark.parametrize(
    ("options", "expected"),
    [({"include_usage": True}, True), ({"include_usage": False}, False), ({}, False), (None, False),
     ({"include_usage": None}, False), ({"include_usage": True, "include_obfuscation": False}, True)],
)
def test_include_usage_comes_from_stream_options(options: Any, expected: bool) -> None:
    assert chat(stream=True, stream_options=options).include_usage is expected
    assert completion(stream=True, stream_options=options).include_usage is expected


@pytest.mark.parametrize("stream", [False, None])
def test_stream_options_without_stream_is_rejected(stream: Any) -> None:
    for err in both_errors(stream=stream, stream_options={"include_usage": True}):
        assert_400(err, "stream_options", "invalid_value")


def test_null_stream_options_without_stream_is_fine() -> None:
    assert chat(stream_options=None).include_usage is False


@pytest.mark.parametrize(
    ("options", "param", "code"),
    [("yes", "stream_options", "invalid_type"), ([], "stream_options", "invalid_type"),
     ({"include_usage": "yes"}, "stream_options.include_usage", "invalid_type"),
     ({"include_usage": 1}, "stream_options.include_usage", "invalid_type"),
     ({"verbose": True}, "stream_options.verbose", "unknown_parameter")],
)
def test_malformed_stream_options_are_rejected(options: Any, param: str, code: str) -> None:
    for err in both_errors(stream=True, stream_options=options):
        assert_400(err, param, code)


@pytest.mark.parametrize("value", [True, False])
def test_vllms_continuous_usage_stats_is_ignored_and_named_not_refused(value: bool) -> None:
    """vLLM's ``stream_options.continuous_usage_stats`` (usage on every chunk): a parameter vLLM
    takes is accepted (docs/api.md, Tolerance) and, not honoured, named; it was a 400
    ``unknown_parameter``, so a client set up for vLLM could not stream here at all. Under
    ``--strict-params`` it is unknown, as any parameter that is not honoured."""
    options = {"include_usage": True, "continuous_usage_stats": value}
    for req in (chat(stream=True, stream_options=options), completion(stream=True, stream_options=options)):
        assert req.include_usage is True and "stream_options.continuous_usage_stats" in req.ignored
    assert_400(chat_error(stream=True, stream_options={"continuous_usage_stats": "yes"}), "stream_options.continuous_usage_stats", "invalid_type")
    with pytest.raises(ApiError) as strict:
        chat(True, stream=True, stream_options=options)
    assert_400(strict.value, "stream_options.continuous_usage_stats", "unknown_parameter")


# -- GenerationRequest wire format -------------------------------------------------------------


@pytest.mark.parametrize(
    "req",
    [
        GenerationRequest(endpoint="chat", model="m", messages=[{"role": "user", "content": "é"}],
                          max_tokens=5, temperature=0.0, seed=3, stop=["\n"], stream=True,
                          include_usage=True, user="u"),
        GenerationRequest(endpoint="completions", model="m", prompt=[1, 2, 3], suffix="end", top_k=4),
        GenerationRequest(endpoint="completions", model="m", prompt="text"),
    ],
    ids=["chat", "token-prompt", "text-prompt"],
)
def test_wire_form_crosses_the_link_unchanged(req: GenerationRequest) -> None:
    from scheduler.link.messages import Submit, decode, encode

    wire = req.to_wire()
    assert decode(encode(Submit(id="j", request=wire))).request == json.loads(json.dumps(wire)) == wire


def test_to_wire_has_every_field_and_shares_no_lists() -> None:
    req = chat(stop=["x"])
    wire = req.to_wire()
    assert set(wire) == {
        "endpoint", "model", "messages", "prompt", "suffix", "max_tokens", "temperature", "top_p", "top_k",
        "min_p", "seed", "presence_penalty", "frequency_penalty", "repeat_penalty", "stop", "stream",
        "include_usage", "user", "logit_bias", "ignore_eos", "typical_p", "logprobs", "response_format",
        "tools", "tool_choice", "parallel_tool_calls", "legacy_functions", "chat_template_kwargs", "ignored", "n", "prompts", "echo",
        "fim_prompt", "fim_extra",  # POST /infill
    }
    wire["stop"].append("y")
    wire["messages"][0]["content"] = "changed"
    assert req.stop == ["x"] and req.messages == USER


# -- every string must be valid Unicode text (issue 10: one lone surrogate took the API down) ---

SURROGATE_BODIES = {
    "content": ({"messages": [{"role": "user", "content": "\ud800"}]}, "messages[0].content"),
    "content-part": ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a\udfffb"}]}]}, "messages[0].content[0].text"),
    "name": ({"messages": [{"role": "user", "content": "hi", "name": "\udc80"}]}, "messages[0].name"),
    "stop": ({"messages": [{"role": "user", "content": "hi"}], "stop": ["ok", "\ud800"]}, "stop[1]"),
    "user": ({"messages": [{"role": "user", "content": "hi"}], "user": "\ud800"}, "user"),
    "tool": ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f", "description": "\ud800"}}]}, "tools[0].function.description"),
    "model": ({"model": "\ud800", "messages": [{"role": "user", "content": "hi"}]}, "model"),
}


def _surrogate_json(obj: dict[str, object]) -> bytes:
    return json.dumps({"model": "smollm2", **obj}).encode()  # ensure_ascii: "\ud800" escapes


@pytest.mark.parametrize("case", sorted(SURROGATE_BODIES))
def test_a_lone_surrogate_anywhere_is_a_400_naming_its_param(case: str) -> None:
    obj, param = SURROGATE_BODIES[case]
    err = raw_chat_error(_surrogate_json(obj))
    assert_400(err, param, "invalid_value")
    assert "surrogate" in err.message


@pytest.mark.parametrize(("obj", "param"), [({"prompt": "\ud800"}, "prompt"), ({"prompt": ["\ud800"]}, "prompt[0]"), ({"prompt": "a", "suffix": "\udbff"}, "suffix")])
def test_a_lone_surrogate_in_a_completion_prompt_or_suffix_is_a_400(obj: dict[str, object], param: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_completion_request(_surrogate_json(obj), models=["smollm2"])
    assert_400(err.value, param, "invalid_value")


def test_surrogates_sent_as_raw_cesu8_bytes_are_a_400_too() -> None:
    # json.loads(bytes) would accept these three bytes as "\ud800"; they are not UTF-8
    raw = b'{"model": "smollm2", "messages": [{"role": "user", "content": "x\xed\xa0\x80"}]}'
    assert_400(raw_chat_error(raw), "messages[0].content", "invalid_value")
    pair = b'{"model": "smollm2", "messages": [{"role": "user", "content": "\xed\xa0\xbd\xed\xb8\x80"}]}'
    assert_400(raw_chat_error(pair), "messages[0].content", "invalid_value")


def test_a_body_in_utf16_is_not_json_here_though_json_loads_would_take_it() -> None:
    raw = json.dumps({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}).encode("utf-16")
    assert_400(raw_chat_error(raw), None, "invalid_json")


def test_a_valid_surrogate_pair_escape_is_ordinary_text() -> None:
    raw = b'{"model": "smollm2", "messages": [{"role": "user", "content": "\\ud83d\\ude00 ok"}]}'
    req = parse_chat_request(raw, models=["smollm2"])
    assert req.messages == [{"role": "user", "content": "\U0001f600 ok"}]


# -- hostile bodies ----------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.edge.strategies import field_values  # noqa: E402

_values = field_values(ints=st.integers(-300, 2**40))
_KEYS = ["logit_bias", "tools", "tool_choice", "response_format", "logprobs", "top_logprobs", "stop", "ignore_eos",
         "json_schema", "grammar", "n_predict", "typical_p", "chat_template_kwargs", "functions", "function_call",
         "parallel_tool_calls", "guided_json", "top_k", "bogus"]


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(_KEYS), _values, max_size=4), st.booleans())
def test_any_extension_body_parses_or_is_a_clean_400(extra: dict[str, Any], strict: bool) -> None:
    body = {"model": "smollm2", "messages": USER, **extra}
    try:
        req = parse_chat_request(json.dumps(body).encode(), models=MODELS, strict=strict)
    except ApiError as err:
        assert err.status == 400 and err.param is not None
        return
    wire = req.to_wire()
    assert decode(encode(Submit(id="j", request=wire))) == Submit(id="j", request=wire)  # it travels the link unchanged
    assert all(-100 <= b <= 100 for _, b in req.logit_bias)
    assert req.logprobs is None or 0 <= req.logprobs <= 20


_prompts = (
    st.text(max_size=6)
    | st.lists(st.integers(-2, 2**31), max_size=4)
    | st.lists(st.text(max_size=4) | st.lists(st.integers(-2, 50), max_size=3) | _values, max_size=40)
    | _values
)


@settings(max_examples=300, deadline=None)
@given(_prompts, st.none() | st.integers(-2, 40) | _values, st.none() | st.booleans() | _values)
def test_any_prompt_n_and_echo_parse_to_bounded_choices_or_a_clean_400(prompt: Any, n: Any, echo: Any) -> None:
    body = {"model": "smollm2", "prompt": prompt, "n": n, "echo": echo}
    try:
        req = parse_completion_request(json.dumps(body).encode(), models=MODELS)
    except ApiError as err:
        assert err.status == 400 and err.param in ("prompt", "n", "echo")
        return
    choices = req.choices()
    prompts = req.prompts if req.prompts is not None else [req.prompt]
    assert 1 <= req.n <= 16 and len(choices) == req.n * len(prompts) == req.jobs <= 32  # jobs: the lanes the router counts
    assert [c.prompt for c in choices] == [p for p in prompts for _ in range(req.n)]
    for c in choices:
        assert isinstance(c.prompt, str) or (c.prompt and all(isinstance(t, int) and t >= 0 for t in c.prompt))
        assert c.n == 1 and c.prompts is None and c.echo is req.echo
    wire = req.to_wire()
    assert decode(encode(Submit(id="j", request=wire))) == Submit(id="j", request=wire)


# -- embeddings --------------------------------------------------------------------------------

from api.schemas import parse_embeddings_request  # noqa: E402


def embeddings(**body: Any) -> tuple[GenerationRequest, str]:
    return parse_embeddings_request(json.dumps({"model": "smollm2", **body}).encode(), models=MODELS)


def test_embedding_inputs_are_strings_token_ids_or_lists_of_either() -> None:
    assert embeddings(input="hi")[0].prompts == ["hi"]
    assert embeddings(input=[1, 2])[0].prompts == [[1, 2]]
    assert embeddings(input=["a", "b"])[0].prompts == ["a", "b"]
    assert embeddings(input=[[1], [2, 3]])[0].prompts == [[1], [2, 3]]
    assert embeddings(input="hi")[1] == "float" and embeddings(input="hi", encoding_format="base64")[1] == "base64"


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [({}, "input", "missing_required_parameter"), ({"input": 3}, "input", "invalid_type"),
     ({"input": []}, "input", "invalid_value"), ({"input": [""]}, "input", "invalid_value"),
     ({"input": [[-1]]}, "input", "invalid_value"), ({"input": [["a"]]}, "input", "invalid_value"),
     ({"input": ["a"] * 33}, "input", "invalid_value"), ({"input": "a", "encoding_format": "int8"}, "encoding_format", "invalid_value"),
     ({"input": "a", "dimensions": 8}, "dimensions", "unsupported_parameter")],
)
def test_bad_embedding_bodies_are_400_naming_the_param(body: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(ApiError) as info:
        embeddings(**body)
    assert_400(info.value, param, code)


@settings(max_examples=200, deadline=None)
@given(_prompts, st.none() | st.sampled_from(["float", "base64"]) | _values, st.none() | _values)
def test_any_embedding_input_parses_to_at_most_32_inputs_or_a_clean_400(value: Any, fmt: Any, dims: Any) -> None:
    body = {"model": "smollm2", "input": value, "encoding_format": fmt, "dimensions": dims}
    try:
        req, out_fmt = parse_embeddings_request(json.dumps(body).encode(), models=MODELS)
    except ApiError as err:
        assert err.status == 400 and err.param in ("input", "encoding_format", "dimensions")
        return
    assert dims is None and out_fmt in ("float", "base64")
    assert req.prompts and 1 <= len(req.prompts) <= 32
    for item in req.prompts:
        assert (isinstance(item, str) and item) or (item and all(isinstance(t, int) and t >= 0 for t in item))


_CALL = st.fixed_dictionaries({"name": st.text(min_size=1, max_size=4), "arguments": st.text(max_size=4)})
_MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=6)}),
    st.fixed_dictionaries({"role": st.just("assistant"), "content": st.none() | st.text(max_size=6)},
                          optional={"function_call": _CALL,
                                    "tool_calls": st.lists(st.fixed_dictionaries({"id": st.text(min_size=1, max_size=4), "function": _CALL}), max_size=2)}),
    st.fixed_dictionaries({"role": st.just("function"), "name": st.text(min_size=1, max_size=4), "content": st.none() | st.text(max_size=6)}),
    st.fixed_dictionaries({"role": st.just("tool"), "content": st.text(max_size=6)}, optional={"tool_call_id": st.text(max_size=4)}),
    st.fixed_dictionaries(  # anything at all
        {"role": st.sampled_from(["user", "assistant", "tool", "function"]) | _values},
        optional={"content": _values, "name": _values, "tool_call_id": _values, "function_call": _values, "tool_calls": _values},
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_MESSAGE, min_size=1, max_size=5), st.booleans())
def test_any_conversation_with_legacy_function_turns_parses_to_template_messages_or_a_clean_400(messages: list[Any], legacy: bool) -> None:
    """Hostile conversations mixing tool calls, legacy function calls and function results: each
    parses to messages the chat template reads (a tool result always answers some call id, no
    internal marker left behind) or is a 400 naming a parameter."""
    body: dict[str, Any] = {"model": "smollm2", "messages": messages}
    if legacy:
        body["functions"] = [TOOL["function"]]
    try:
        req = parse_chat_request(json.dumps(body).encode(), models=MODELS)
    except ApiError as err:
        assert err.status == 400 and err.param is not None
        return
    assert req.messages is not None and req.legacy_functions == legacy and len(req.messages) == len(messages)
    for sent, msg in zip(messages, req.messages, strict=True):
        assert set(msg) <= {"role", "content", "tool_calls", "tool_call_id", "name"}
        assert msg["role"] in ("system", "user", "assistant", "tool") and isinstance(msg["content"], str)
        if sent["role"] == "function":  # a legacy result: a tool result for a call id, named
            assert msg["role"] == "tool" and msg["name"] == sent["name"] and isinstance(msg["tool_call_id"], str)
