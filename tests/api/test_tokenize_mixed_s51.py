"""llama-server's ``POST /tokenize`` with ``content`` an array of strings and token ids (its
``tokenize_mixed``, server-common.cpp: the route's own reading of ``content``): each string
tokenised, special tokens parsed as ``parse_special`` says and ``add_special`` only for a string
that begins the array, each id as it is. It was 400 ``invalid_type`` here, where llama-server
answers ``{"content": ["a", 1]}`` with ``[81, 1]``. In process (tests/edge/inproc.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.edge.inproc import JSON, SimWorker, attached, attached_loop, request

N_VOCAB = 49152  # the bundled SmolLM2's: /tokenize reads the model's file in the web process


def post(**fields: Any) -> bytes:
    return json.dumps(fields, ensure_ascii=False).encode("utf-8", "surrogatepass")


@pytest.mark.django_db(transaction=True)
async def test_an_array_of_strings_and_ids_is_tokenised_as_llama_server_tokenizes_it() -> None:
    async with attached(SimWorker()):
        mixed = await request("POST", "/tokenize", post(content=["a", 1, "<|im_end|> b"]), JSON)
        raw = await request("POST", "/tokenize", post(content=["<|im_end|>"], parse_special=False), JSON)
        ids = await request("POST", "/tokenize", post(content=[19556, 905], with_pieces=True), JSON)
        empty = await request("POST", "/tokenize", post(content=[]), JSON)
    assert mixed.status == 200, mixed.body
    assert mixed.json() == {"tokens": [81, 1, 2, 278]}  # llama-server's answer, measured (2: <|im_end|>, parsed)
    assert raw.json() == {"tokens": [44, 108, 306, 79, 486, 108, 46]}  # llama-server's: the text, no control token
    assert ids.json() == {"tokens": [{"id": 19556, "piece": "Hello"}, {"id": 905, "piece": " world"}]}
    assert empty.json() == {"tokens": []}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("content", "code"),
    [([-1], "invalid_value"), (["a", N_VOCAB], "invalid_value"), ([10**30], "invalid_value"),
     ([True], "invalid_type"), (["a", 1.0], "invalid_type"), ([["a"]], "invalid_type"), ([None], "invalid_type"), ({"a": 1}, "invalid_type")],
)  # fmt: skip
async def test_an_array_with_an_id_outside_the_vocabulary_or_another_item_is_400_naming_content(content: Any, code: str) -> None:
    """(llama-server answers a 500 for these: an id its vocabulary has not, an item it cannot read.)"""
    async with attached(SimWorker()):
        reply = await request("POST", "/tokenize", post(content=content), JSON)
    assert reply.status == 400 and reply.is_error_object(), reply.body
    assert (reply.json()["error"]["param"], reply.json()["error"]["code"]) == ("content", code)


@pytest.fixture(scope="module")
def edge() -> Iterator[asyncio.AbstractEventLoop]:
    with attached_loop(SimWorker()) as loop:
        yield loop


_text = st.lists(st.text(st.characters(codec="utf-8"), max_size=4) | st.sampled_from(["<|im_start|>", "<|im_end|>", " ", "\n"]), max_size=4).map("".join)
_item = _text | st.integers(-3, N_VOCAB + 3) | st.booleans() | st.none() | st.floats(allow_nan=False, allow_infinity=False) | st.lists(st.integers(0, 9), max_size=2)


@pytest.mark.django_db(transaction=True)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(content=st.lists(_item, max_size=6), add_special=st.booleans(), parse_special=st.booleans())
def test_any_array_is_its_parts_tokenised_in_turn_or_a_400(edge: asyncio.AbstractEventLoop, content: list[Any], add_special: bool, parse_special: bool) -> None:
    """Hostile arrays: a reply whose tokens are each string's (as ``content`` alone, the first
    with ``add_special``) and each id in turn, or a 400 naming ``content``; never a 500."""

    def tokenize(body: bytes) -> Any:
        return edge.run_until_complete(asyncio.wait_for(request("POST", "/tokenize", body, JSON), 30))

    reply = tokenize(post(content=content, add_special=add_special, parse_special=parse_special))
    event(f"status {reply.status}")
    readable = all(isinstance(v, str) or (type(v) is int and 0 <= v < N_VOCAB) for v in content)
    if not readable:
        assert reply.status == 400 and reply.json()["error"]["param"] == "content", reply.body
        return
    assert reply.status == 200, reply.body
    expected: list[int] = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            alone = tokenize(post(content=part, add_special=add_special and i == 0, parse_special=parse_special))
            expected += alone.json()["tokens"]
        else:
            expected.append(part)
    assert reply.json() == {"tokens": expected}
