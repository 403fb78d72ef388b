"""``POST /completion`` with a prompt mixing strings and token ids: its strings are tokenised in
the web process while the body is parsed, before the request is admitted (so before its key's or
client's rate limit). A prompt of a million items (or one of strings longer than any context)
was tokenised whole, a tokeniser call an item, seconds of the web process's threads for each
body a client sent, however limited, only to be refused as too long after. Now it is tokenised
only as far as it may fit the lane's context, then refused as any too-long prompt is."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.schemas import parse_native_completion_request
from tests.edge.inproc import JSON, MODEL, SimWorker, attached, request

CTX = 256


class _Tokeniser:
    """A token a byte (the simulated engine's vocabulary), counting its calls and characters."""

    def __init__(self) -> None:
        self.calls = self.chars = 0

    def __call__(self, model: str, text: str, first: bool) -> list[int]:
        self.calls += 1
        self.chars += len(text)
        return ([1] if first else []) + list(text.encode())


def _parse(prompt: Any, tokeniser: _Tokeniser) -> Any:
    body = json.dumps({"prompt": prompt}).encode()
    return parse_native_completion_request(body, models=[MODEL], tokenize=tokeniser, lane_ctx=lambda model: CTX)[0]


@settings(max_examples=40, deadline=None)
@given(items=st.lists(st.one_of(st.text(max_size=3), st.integers(0, 255)), min_size=2, max_size=40), repeat=st.integers(1, 2_000))
def test_fuzz_a_mixed_prompt_costs_work_bounded_by_the_context(items: list[Any], repeat: int) -> None:
    tokeniser = _Tokeniser()
    prompt = items * repeat
    try:
        req = _parse(prompt, tokeniser)
    except Exception as exc:  # a prompt that is no mixed prompt (all ids, all strings) may be refused
        assert getattr(exc, "status", None) == 400, exc
        return
    # at most one call a token the context holds (an empty string past the first: no call), and
    # no more text tokenised than can fit
    assert tokeniser.calls <= CTX + 1
    assert tokeniser.chars <= CTX * 64 + 3
    if isinstance(req.prompt, list) and len(req.prompt) < CTX:  # it fits: every item, in order
        expected: list[int] = []
        for i, v in enumerate(prompt):
            expected += ([1] if i == 0 else []) + list(v.encode()) if isinstance(v, str) else [v]
        assert req.prompt == expected


def test_a_million_item_mixed_prompt_makes_at_most_a_context_of_calls() -> None:
    tokeniser = _Tokeniser()
    _parse(["a", 7] * 500_000, tokeniser)
    assert tokeniser.calls <= CTX
    tokeniser = _Tokeniser()
    _parse(["", 7] + [""] * 1_000_000, tokeniser)  # empty strings: no tokens, and no calls
    assert tokeniser.calls == 1
    tokeniser = _Tokeniser()
    _parse(["x" * (CTX * 64 + 1), 7], tokeniser)  # text longer than any context of CTX holds
    assert tokeniser.calls == 0


@pytest.mark.django_db(transaction=True)
async def test_a_mixed_prompt_too_long_for_the_context_is_a_400_naming_the_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    from api.consumers import NativeCompletionConsumer

    tokeniser = _Tokeniser()
    monkeypatch.setattr(NativeCompletionConsumer, "tokenize", staticmethod(tokeniser))
    async with attached(SimWorker(lane_ctx=512)):
        too_long = await request("POST", "/completion", json.dumps({"prompt": ["ab", 33] * 200_000, "n_predict": 2}).encode(), JSON)
        fits = await request("POST", "/completion", json.dumps({"prompt": ["Hello", 33], "n_predict": 2}).encode(), JSON)
    assert too_long.status == 400 and too_long.is_error_object(), too_long.body
    error = too_long.json()["error"]
    assert (error["param"], error["code"]) == ("prompt", "context_length_exceeded")
    assert tokeniser.calls <= 512, tokeniser.calls  # tokenised as far as the context, not whole
    assert fits.status == 200, fits.body
