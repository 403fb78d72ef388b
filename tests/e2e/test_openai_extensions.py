"""What llama-server and vLLM users reach for beyond plain chat, through the unmodified ``openai``
client against the real server and model: tool calls, structured output, logprobs, logit_bias,
ignore_eos and the tolerance of parameters this server does not know."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from .server import RunningServer, openai_client

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "likes": {"type": "array", "items": {"type": "string", "enum": ["tea", "coffee", "books", "music"]}, "maxItems": 3},
    },
    "required": ["name", "age", "likes"],
    "additionalProperties": False,
}


def client(server: RunningServer) -> openai.OpenAI:
    return openai_client(server.base, timeout_s=900)


def test_named_tool_call_parses_fits_the_schema_and_the_result_is_answered(server: RunningServer) -> None:
    c = client(server)
    question = [{"role": "user", "content": "What is the weather like in Paris?"}]
    reply = c.chat.completions.create(
        model=MODEL, messages=question, tools=[WEATHER], max_tokens=80,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    follow = c.chat.completions.create(
        model=MODEL, tools=[WEATHER], max_tokens=40, temperature=0,
        messages=[*question, choice.message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny", "temperature": 21}'}],
    )
    assert follow.choices[0].message.content
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_a_call_the_model_begins_in_tool_choice_auto_parses_and_fits_the_schema(server: RunningServer) -> None:
    """tool_choice auto (the default): SmolLM2, steered by a bias on "<" (its token 44) to open a
    call, wrote "<tool_call>\n<name><function-name>..." to max_tokens, which the client got as
    content with finish_reason length. A call it begins is now held to the tools' parameters."""
    reply = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather like in Paris?"}], tools=[WEATHER],
        max_tokens=120, temperature=0, logit_bias={"44": 8}, parallel_tool_calls=False,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name == "get_weather"  # type: ignore[union-attr]
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])  # type: ignore[index,union-attr]


def test_a_legacy_functions_client_gets_a_function_call_and_its_result_is_answered(server: RunningServer) -> None:
    """The deprecated ``functions``/``function_call`` API, as older clients send it: the reply's
    ``message.function_call``, streamed as ``function_call`` deltas, and the result sent back as a
    ``function`` message."""
    c = client(server)
    question = [{"role": "user", "content": "What is the weather like in Oslo?"}]
    forced = {"model": MODEL, "messages": question, "functions": [WEATHER["function"]], "function_call": {"name": "get_weather"}, "max_tokens": 80}
    choice = c.chat.completions.create(**forced).choices[0]  # type: ignore[call-overload]
    assert choice.finish_reason == "function_call" and not choice.message.tool_calls
    call = choice.message.function_call
    assert call is not None and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
    chunks = list(c.chat.completions.create(**forced, stream=True))  # type: ignore[call-overload]
    deltas = [ch.choices[0].delta.function_call for ch in chunks if ch.choices and ch.choices[0].delta.function_call]
    assert deltas[0].name == "get_weather"
    jsonschema.validate(json.loads("".join(d.arguments or "" for d in deltas)), WEATHER["function"]["parameters"])
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["function_call"]
    follow = c.chat.completions.create(  # type: ignore[call-overload]
        model=MODEL, functions=[WEATHER["function"]], max_tokens=40, temperature=0,
        messages=[*question, choice.message.model_dump(exclude_none=True),
                  {"role": "function", "name": "get_weather", "content": '{"sky": "sunny", "temperature": 21}'}],
    )
    assert follow.choices[0].message.content or follow.choices[0].message.function_call


def test_required_tool_call_streams_as_openai_streams_tool_calls(server: RunningServer) -> None:
    chunks = list(client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Rome, in celsius?"}], tools=[WEATHER],
        tool_choice="required", parallel_tool_calls=False, max_tokens=80, stream=True,
    ))
    deltas = [d for ch in chunks if ch.choices for d in (ch.choices[0].delta.tool_calls or [])]
    assert deltas and deltas[0].id and deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas if d.index == 0)
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["tool_calls"]


def test_allowed_tools_forces_a_call_of_an_allowed_function_only(server: RunningServer) -> None:
    """OpenAI's ``allowed_tools`` tool_choice, as the openai package types it: of the tools
    offered, only the allowed one is called (it was a 400)."""
    clock = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
    reply = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is the weather like in Paris?"}], tools=[WEATHER, clock],
        tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "get_time"}}]}},
        parallel_tool_calls=False, max_tokens=80, temperature=0,  # one call, not calls until max_tokens
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    assert {call.function.name for call in choice.message.tool_calls} == {"get_time"}
    assert all(json.loads(call.function.arguments) == {} for call in choice.message.tool_calls)


def test_a_forced_tool_call_is_not_cut_by_the_clients_stop_strings(server: RunningServer) -> None:
    """A forced call's whole reply is tool-call markup (the grammar allows nothing else), and a
    stop string matched inside it: with stop "\n" the reply was the text "<tool_call>" as
    content, finish "stop", and no call, though the call was required."""
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        reply = client(server).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is the weather like in Paris?"}], tools=[WEATHER],
            tool_choice=choice, parallel_tool_calls=False, stop=["\n", "Paris"], max_tokens=80, temperature=0,  # type: ignore[arg-type]
        )
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls" and message.tool_calls, reply
        assert not message.content and {call.function.name for call in message.tool_calls} == {"get_weather"}


def test_streamed_arguments_come_in_fragments_that_add_up_to_the_non_streamed_call(server: RunningServer) -> None:
    """The openai client's own stream helper: the call's arguments arrive in several deltas as
    they are generated, and what it accumulates is exactly the non-streamed reply's arguments."""
    c = client(server)
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "What is the weather like in Paris?"}],
           "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
           "max_tokens": 80, "temperature": 0}
    plain = c.chat.completions.create(**ask).choices[0].message.tool_calls
    assert plain and len(plain) == 1
    fragments = 0
    with c.chat.completions.stream(**ask) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                fragments += 1
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and final.message.tool_calls
    (call,) = final.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", plain[0].function.arguments)
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    assert fragments > 1


@pytest.mark.parametrize(
    "prompt",
    ["Describe a person as JSON.", "Who is your favourite author?", "Tell me about a chef from Lyon.",
     "What is 2 + 2?"],
)
def test_json_schema_replies_parse_and_fit_the_schema(server: RunningServer, prompt: str) -> None:
    reply = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=120, seed=len(prompt),
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), PERSON)


@pytest.mark.parametrize("prompt", ["What is the weather in Paris, in celsius?", "Describe a person as JSON."])
def test_tools_beside_a_json_schema_give_a_call_that_fits_or_an_answer_that_fits(server: RunningServer, prompt: str) -> None:
    """Agent frameworks send tools and a response format together (tool_choice auto): the reply
    is calls whose arguments fit their function, or an answer that fits the format. It was a
    400."""
    reply = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=120, temperature=0, tools=[WEATHER],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    message = reply.choices[0].message
    if message.tool_calls:
        assert reply.choices[0].finish_reason == "tool_calls" and message.content is None
        for call in message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])  # type: ignore[index]
    else:
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(message.content or ""), PERSON)


def test_json_schema_holds_when_streamed(server: RunningServer) -> None:
    chunks = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a person."}], max_tokens=120, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
    )
    jsonschema.validate(json.loads("".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)), PERSON)


@pytest.mark.parametrize("prompt", ["Reply with a JSON object with keys a and b."])
def test_json_object_replies_parse_as_objects(server: RunningServer, prompt: str) -> None:
    reply = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=200, temperature=0,
        response_format={"type": "json_object"},
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_chat_logprobs_have_one_entry_per_completion_token(server: RunningServer) -> None:
    reply = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=12, logprobs=True, top_logprobs=3,
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[2].logprob
        assert entry.logprob <= entry.top_logprobs[0].logprob + 1e-6
    # a character split across tokens (an emoji) is whole only in the tokens' bytes together; one
    # that max_tokens cut short is U+FFFD in the text (sampled: it happens), as its bytes decode
    assert bytes(b for e in content for b in e.bytes).decode("utf-8", "replace") == reply.choices[0].message.content


def test_streamed_logprobs_and_completions_logprobs(server: RunningServer) -> None:
    c = client(server)
    chunks = list(c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, logprobs=True, top_logprobs=2,
        stream=True, stream_options={"include_usage": True},
    ))
    entries = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert len(entries) == chunks[-1].usage.completion_tokens
    # greedy: the legacy format's token strings join to the text only where no character is
    # split across tokens (it has no bytes field)
    done = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, logprobs=2, temperature=0)
    lp = done.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == done.usage.completion_tokens
    assert "".join(lp.tokens) == done.choices[0].text
    assert all(len(top) == 2 for top in lp.top_logprobs)


def test_logit_bias_of_minus_100_keeps_a_token_out(server: RunningServer) -> None:
    c = client(server)
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=16,
               temperature=0, logprobs=True)
    plain = c.chat.completions.create(**ask)
    banned = plain.choices[0].logprobs.content[0]
    # the greedy first token, banned by id; its id comes from /tokenize
    (token_id,) = httpx.post(server.base + "/tokenize", json={"content": banned.token, "add_special": False}, timeout=60).json()["tokens"]
    biased = c.chat.completions.create(**ask, logit_bias={str(token_id): -100})
    tokens = [e.token for e in biased.choices[0].logprobs.content]
    assert banned.token not in tokens and tokens[0] != banned.token


def test_ignore_eos_runs_to_max_tokens(server: RunningServer) -> None:
    c = client(server)
    # greedy, with "I" banned, the model answers "Yes." and stops after two tokens
    (i_token,) = httpx.post(server.base + "/tokenize", json={"content": "I"}, timeout=60).json()["tokens"]
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "Say yes."}], max_tokens=40, temperature=0,
               logit_bias={str(i_token): -100})
    plain = c.chat.completions.create(**ask)
    assert plain.choices[0].finish_reason == "stop" and plain.usage.completion_tokens < 40
    reply = c.chat.completions.create(**ask, extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 40
    assert reply.choices[0].message.content.startswith(plain.choices[0].message.content)


def test_unknown_parameters_are_ignored_and_named_in_a_header(server: RunningServer) -> None:
    raw = client(server).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
        extra_body={"mirostat": 2, "dry_multiplier": 0.8, "repetition_penalty": 1.1, "typical_p": 0.9,
                    "chat_template_kwargs": {"enable_thinking": False}, "cache_prompt": True},
    )
    assert raw.headers["x-superfluid-ignored-params"] == "mirostat, dry_multiplier"
    assert raw.parse().choices[0].message.content is not None
    plain = client(server).chat.completions.with_raw_response.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert "x-superfluid-ignored-params" not in plain.headers


def test_a_schema_that_cannot_be_enforced_is_a_400_and_the_server_keeps_serving(server: RunningServer) -> None:
    c = client(server)
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], extra_body={"grammar": "root ::= nowhere"})
    assert err.value.body["param"] == "response_format"
    assert c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2).choices
