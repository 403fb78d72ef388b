"""Numbers at JSON's edges in every parameter: an integer literal of hundreds of digits (JSON
has no bound; Python keeps it exact), the extremes of a double, int64's edges. Each request
parses, and what it parses to travels the link, or it is a clean 400 naming its parameter; never
an OverflowError (which the consumer answers with a 500)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api import schemas
from api.errors import ApiError
from scheduler.link.messages import Submit, decode, encode

MODELS = ["m"]
_EDGES = [10**400, -(10**400), 2**63, 2**63 - 1, -(2**63), -(2**63) - 1, 2**64, 2**31, 1.7976931348623157e308, -1.7976931348623157e308, 5e-324, -0.0, 0, 1, -1]
_numbers = st.sampled_from(_EDGES) | st.integers(-(10**30), 10**30) | st.floats(allow_nan=False, allow_infinity=False)
_CHAT_KEYS = sorted(schemas._CHAT_KEYS - {"model", "messages"})
_COMPLETION_KEYS = sorted(schemas._COMPLETION_KEYS - {"model", "prompt"})


def _check(parse: Any, body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()
    try:
        req = parse(raw, models=MODELS)
    except ApiError as err:
        assert err.status == 400 and err.param is not None, err
        return
    wire = req.to_wire()
    assert decode(encode(Submit(id="j", request=wire))) == Submit(id="j", request=wire)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(_CHAT_KEYS), _numbers | st.lists(_numbers, max_size=2) | st.dictionaries(st.sampled_from(["1", "include_usage", "type"]), _numbers, max_size=2), max_size=3))
def test_any_number_in_any_chat_parameter_parses_or_is_a_clean_400(extra: dict[str, Any]) -> None:
    _check(schemas.parse_chat_request, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, **extra})


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(_COMPLETION_KEYS), _numbers | st.lists(_numbers, max_size=2), max_size=3), _numbers | st.lists(_numbers, max_size=3))
def test_any_number_in_any_completion_parameter_or_prompt_parses_or_is_a_clean_400(extra: dict[str, Any], prompt: Any) -> None:
    _check(schemas.parse_completion_request, {"model": "m", "prompt": prompt, **extra})


@settings(max_examples=100, deadline=None)
@given(_numbers | st.lists(_numbers, min_size=1, max_size=3))
def test_any_number_as_an_embeddings_input_parses_or_is_a_clean_400(value: Any) -> None:
    _check(lambda raw, models: schemas.parse_embeddings_request(raw, models=models)[0], {"model": "m", "input": value})


# -- each parameter by name: a 401-digit integer literal (10**400 once read) ----------------------

_HUGE_TEXT = "1" + "0" * 400
_CHAT = '{"model": "m", "messages": [{"role": "user", "content": "hi"}], %s}'
_COMPLETION = '{"model": "m", "prompt": "hi", %s}'


@pytest.mark.parametrize(
    ("template", "field", "param"),
    [
        *((t, f'"{p}": {sign}{_HUGE_TEXT}', p) for t in (_CHAT, _COMPLETION) for sign in ("", "-")
          for p in ("temperature", "top_p", "min_p", "typical_p", "presence_penalty", "frequency_penalty", "seed", "n")),
        *((t, f'"{p}": -{_HUGE_TEXT}', p) for t in (_CHAT, _COMPLETION) for p in ("max_tokens", "max_completion_tokens", "top_k", "repeat_penalty")),
        *((t, f'"logit_bias": {bias}', "logit_bias") for t in (_CHAT, _COMPLETION)
          for bias in (f'{{"1": {_HUGE_TEXT}}}', f'{{"1": -{_HUGE_TEXT}}}', f"[[1, {_HUGE_TEXT}]]", f"[[{_HUGE_TEXT}, 1]]", f"[[-{_HUGE_TEXT}, 1]]")),
        (_COMPLETION, f'"logprobs": {_HUGE_TEXT}', "logprobs"),
        (_CHAT, f'"logprobs": true, "top_logprobs": {_HUGE_TEXT}', "top_logprobs"),
        (_CHAT, f'"logprobs": true, "top_logprobs": -{_HUGE_TEXT}', "top_logprobs"),
    ],
)
def test_a_huge_integer_out_of_a_parameters_range_is_a_400_naming_it(template: str, field: str, param: str) -> None:
    parse = schemas.parse_chat_request if template is _CHAT else schemas.parse_completion_request
    with pytest.raises(ApiError) as caught:
        parse((template % field).encode(), models=MODELS)
    assert caught.value.status == 400 and caught.value.param == param, caught.value


@pytest.mark.parametrize(
    ("field", "key", "expected"),
    [
        # no bound above: the request may ask this much (the worker refuses a completion longer
        # than its context with a 400 of its own); a float parameter is the largest float
        (f'"max_tokens": {_HUGE_TEXT}', "max_tokens", 10**400),
        (f'"max_completion_tokens": {_HUGE_TEXT}', "max_tokens", 10**400),
        (f'"top_k": {_HUGE_TEXT}', "top_k", 10**400),
        (f'"repeat_penalty": {_HUGE_TEXT}', "repeat_penalty", 1.7976931348623157e308),
        (f'"n_predict": -{_HUGE_TEXT}', "max_tokens", None),
    ],
)
def test_a_huge_integer_within_a_parameters_range_parses_and_travels_the_link(field: str, key: str, expected: Any) -> None:
    for template, parse in ((_CHAT, schemas.parse_chat_request), (_COMPLETION, schemas.parse_completion_request)):
        req = parse((template % field).encode(), models=MODELS)
        wire = req.to_wire()
        assert wire[key] == expected
        assert decode(encode(Submit(id="j", request=wire))) == Submit(id="j", request=wire)


def test_a_huge_integer_in_a_schema_or_a_tools_parameters_parses_and_travels_the_link_exactly() -> None:
    """The API reads a schema as data (the worker compiles it: tests/engines/test_grammar_huge_numbers.py)."""
    schema = f'{{"type": "integer", "minimum": -{_HUGE_TEXT}, "maximum": {_HUGE_TEXT}, "enum": [{_HUGE_TEXT}]}}'
    field = (
        f'"response_format": {{"type": "json_schema", "json_schema": {{"name": "n", "schema": {schema}}}}}, '
        f'"tools": [{{"type": "function", "function": {{"name": "f", "parameters": {{"type": "object", "properties": {{"a": {schema}}}}}}}}}]'
    )
    wire = schemas.parse_chat_request((_CHAT % field).encode(), models=MODELS).to_wire()
    back = decode(encode(Submit(id="j", request=wire)))
    assert isinstance(back, Submit)
    assert back.request["response_format"]["schema"]["maximum"] == 10**400
    assert back.request["tools"][0]["parameters"]["properties"]["a"]["minimum"] == -(10**400)
