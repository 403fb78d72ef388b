"""Numbers at JSON's edges in every parameter: an integer literal of hundreds of digits (JSON
has no bound; Python keeps it exact), the extremes of a double, int64's edges. Each request
parses, and what it parses to travels the link, or it is a clean 400 naming its parameter; never
an OverflowError (which the consumer answers with a 500)."""

from __future__ import annotations

import json
from typing import Any

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
