"""``/v1/embeddings`` through the unmodified ``openai`` client against the real server and model."""

from __future__ import annotations

import math
from collections.abc import Iterator

import httpx
import openai
import pytest

from .server import RunningServer

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def c(server: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=600) as cl:
        yield cl


def test_same_text_same_vector_different_texts_differ_and_shapes_are_right(c: openai.OpenAI) -> None:
    texts = ["The cat sat on the mat.", "Quarterly revenue grew by ten percent.", "The cat sat on the mat."]
    reply = c.embeddings.create(model=MODEL, input=texts)  # the client asks for base64 and decodes it
    assert reply.object == "list" and reply.model == MODEL
    assert [d.index for d in reply.data] == [0, 1, 2]
    vectors = [d.embedding for d in reply.data]
    assert len({len(v) for v in vectors}) == 1 and len(vectors[0]) > 100
    assert vectors[0] == vectors[2] and vectors[0] != vectors[1]
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-4) for v in vectors)  # L2-normalised
    alone = c.embeddings.create(model=MODEL, input="The cat sat on the mat.", encoding_format="float")
    assert alone.data[0].embedding == pytest.approx(vectors[0], abs=1e-6)  # float and base64 agree
    assert reply.usage.prompt_tokens == reply.usage.total_tokens > 0
    assert reply.usage.prompt_tokens == 2 * alone.usage.prompt_tokens + c.embeddings.create(model=MODEL, input=texts[1]).usage.prompt_tokens


def test_token_arrays_embed_like_their_text(server: RunningServer, c: openai.OpenAI) -> None:
    text = "Paris is the capital of France."
    tokens = httpx.post(server.base + "/tokenize", json={"content": text, "add_special": True}, timeout=30).json()["tokens"]
    by_text = c.embeddings.create(model=MODEL, input=text, encoding_format="float").data[0].embedding
    by_ids = c.embeddings.create(model=MODEL, input=tokens, encoding_format="float").data[0].embedding
    both = c.embeddings.create(model=MODEL, input=[tokens, tokens[:3]], encoding_format="float").data
    assert by_ids == pytest.approx(by_text, abs=1e-6) and both[0].embedding == pytest.approx(by_text, abs=1e-6)
    assert len(both) == 2 and both[1].embedding != both[0].embedding


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [({"dimensions": 64}, "dimensions", "unsupported_parameter"), ({"input": []}, "input", "invalid_value"),
     ({"input": ""}, "input", "invalid_value"), ({"encoding_format": "int8"}, "encoding_format", "invalid_value"),
     ({"input": ["a"] * 33}, "input", "invalid_value"), ({"input": [[10**9]]}, "input", "invalid_value")],
)
def test_bad_embedding_requests_are_clear_400s(server: RunningServer, extra: dict, param: str, code: str) -> None:
    body = {"model": MODEL, "input": "hello", **extra}
    r = httpx.post(server.base + "/v1/embeddings", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == code
    if param == "dimensions":
        assert "dimensions" in err["message"]
