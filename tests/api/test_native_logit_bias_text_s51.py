"""llama-server's ``logit_bias`` of text on its native ``POST /completion``: a key of the object
form that is no integer (``{"Hello": -100}``), or a string in the array form (``[["Hello",
false]]``), biases every token of that text (server-schema.cpp's logit_bias field, tokenised as
``common_tokenize(vocab, text, false)``). Both were 400 ``invalid_value`` here, where
llama-server answers them (seen in the sweep against it: ``[["-", false]]`` on "Hi there")."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.errors import ApiError
from api.schemas import MAX_LOGIT_BIAS, parse_native_completion_request
from tests.edge.inproc import JSON, MODEL, SimWorker, attached, request


def tokens_of(model: str, text: str) -> list[int]:
    """A stand-in vocabulary: one token per character."""
    return [1000 + ord(c) for c in text]


def parsed(bias: Any) -> list[list[float]]:
    raw = json.dumps({"prompt": "a", "logit_bias": bias}).encode()
    return parse_native_completion_request(raw, models=[MODEL], tokenize_text=tokens_of)[0].logit_bias


@pytest.mark.parametrize(
    ("bias", "expected"),
    [({"ab": -100}, [[1097, -100.0], [1098, -100.0]]),
     ([["ab", False]], [[1097, -100.0], [1098, -100.0]]),
     ([["12", 3]], [[1049, 3.0], [1050, 3.0]]),  # a string in the array form is text, digits too
     ({"12": 3, "x": -1}, [[12, 3.0], [1120, -1.0]]),  # a key of digits is an id, as strtol reads it
     ([[7, 2], ["", 5]], [[7, 2.0]]),  # an empty text has no tokens
     ({"5": 1}, [[5, 1.0]]), ([[5, 1]], [[5, 1.0]])],
)  # fmt: skip
def test_text_biases_become_their_tokens_ids_stay_ids(bias: Any, expected: list[list[float]]) -> None:
    assert parsed(bias) == expected


def test_texts_beyond_the_entries_bound_are_refused_before_they_are_tokenised() -> None:
    def never(model: str, text: str) -> list[int]:
        raise AssertionError("tokenised")

    raw = json.dumps({"prompt": "a", "logit_bias": {"x" * (MAX_LOGIT_BIAS * 64 + 1): -1}}).encode()
    with pytest.raises(ApiError) as refused:
        parse_native_completion_request(raw, models=[MODEL], tokenize_text=never)
    assert refused.value.status == 400 and refused.value.param == "logit_bias"
    with pytest.raises(ApiError):
        parsed({"y" * (MAX_LOGIT_BIAS + 1): -1})  # more tokens than the bound


_key = st.text(max_size=6) | st.sampled_from(["12", " 3", "-1", "+4", "", "0x1", "1e3"])
_value = st.booleans() | st.integers(-200, 200) | st.floats(allow_nan=False, allow_infinity=False) | st.none() | st.text(max_size=2)
_bias = st.dictionaries(_key, _value, max_size=5) | st.lists(st.lists(_key | st.integers(-5, 10**6) | _value, min_size=0, max_size=3), max_size=5) | _value


@given(_bias)
def test_any_logit_bias_is_entries_of_known_tokens_or_a_400_naming_it(bias: Any) -> None:
    try:
        out = parsed(bias)
    except ApiError as exc:
        assert exc.status == 400 and exc.param == "logit_bias"
        return
    assert len(out) <= MAX_LOGIT_BIAS
    assert all(isinstance(t, int) and t >= 0 and -100 <= b <= 100 for t, b in out)


def test_the_routes_tokeniser_is_the_models_vocabulary_without_special_tokens() -> None:
    """The route's own tokeniser (api.consumers.tokenize_text), with the bundled model's
    vocabulary (read in the web process, as for /tokenize): llama-server's tokens for the texts,
    a control token's text as text."""
    from api.consumers import tokenize_text

    raw = json.dumps({"prompt": "a", "logit_bias": [["Hello world", -2.5], ["<|im_end|>", False], [7, 1]]}).encode()
    bias = parse_native_completion_request(raw, models=[MODEL], tokenize_text=tokenize_text)[0].logit_bias
    assert bias[:2] == [[19556, -2.5], [905, -2.5]] and bias[-1] == [7, 1.0]
    assert [t for t, _b in bias[2:-1]] == [44, 108, 306, 79, 486, 108, 46]  # llama-server's /tokenize of it, parse_special false
    keyed = json.dumps({"prompt": "a", "logit_bias": {"Hello": -100}}).encode()
    assert parse_native_completion_request(keyed, models=[MODEL], tokenize_text=tokenize_text)[0].logit_bias == [[19556, -100.0]]


@pytest.mark.django_db(transaction=True)
async def test_completion_passes_a_text_bias_to_the_engine() -> None:
    """Through the route: the body is no longer refused by its parse (the simulated engine,
    which samples with no bias, then refuses any logit_bias itself)."""
    async with attached(SimWorker()):
        reply = await request("POST", "/completion", json.dumps({"prompt": "a", "n_predict": 2, "logit_bias": {"Hello": -100}}).encode(), JSON)
    assert reply.status == 400 and reply.json()["error"]["code"] == "unsupported_parameter", reply.body
    assert "sim engine" in reply.json()["error"]["message"]
