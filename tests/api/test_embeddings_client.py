"""/v1/embeddings and /v1/models through the unmodified ``openai`` client, in-process (the real
ASGI application and worker code around the simulated engine, tests/edge/inproc.py), so that the
client's own defaults are checked without a model: it asks for ``base64`` when no
``encoding_format`` is given and decodes the little-endian float32 bytes itself."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from tests.edge.inproc import MODEL, SimWorker, application, attached

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "http://127.0.0.1:8000"


def vectors_by_length(link: object) -> None:
    """The simulated engine made to embed: a vector that is not float32-exact, from the input's length."""
    engine = link.worker.engine  # type: ignore[attr-defined]
    engine.features = frozenset({"embeddings"})
    engine.embed = lambda tokens: [len(tokens) / 3.0, 0.1, -1e-7]


async def test_the_openai_clients_default_base64_decodes_to_the_float_replys_vectors_and_models_read_back() -> None:
    async with attached(SimWorker()) as (link, _rt):
        vectors_by_length(link)
        transport = httpx.ASGITransport(app=application(), client=("127.0.0.1", 50001))
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
            client = openai.AsyncOpenAI(base_url=BASE + "/v1", api_key="unused", http_client=http, max_retries=0)
            texts = ["ab", "abcd", "ab"]
            default = await client.embeddings.create(model=MODEL, input=texts)  # base64, decoded by the client
            floats = await client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
            assert [d.index for d in default.data] == [d.index for d in floats.data] == [0, 1, 2]
            for b, f in zip(default.data, floats.data, strict=True):
                assert b.embedding == np.asarray(f.embedding, dtype="<f4").tolist()  # the same float32 values
            assert default.data[0].embedding == default.data[2].embedding != default.data[1].embedding
            assert default.usage.prompt_tokens == default.usage.total_tokens == floats.usage.prompt_tokens == 8
            ids = await client.embeddings.create(model=MODEL, input=[[1, 2], [3, 4, 5, 6]], encoding_format="float")
            assert [d.embedding for d in ids.data] == [d.embedding for d in floats.data[:2]]

            listed = await client.models.list()
            assert [(m.id, m.object, m.owned_by) for m in listed.data] == [(MODEL, "model", "superfluid")]
            assert isinstance(listed.data[0].created, int)
            assert (await client.models.retrieve(MODEL)).id == MODEL
            for call in (client.models.retrieve("nope"), client.embeddings.create(model="nope", input="x")):
                with pytest.raises(openai.NotFoundError) as caught:
                    await call
                assert caught.value.code == "model_not_found"
            with pytest.raises(openai.BadRequestError) as bad:
                await client.embeddings.create(model=MODEL, input="x", dimensions=2)
            assert (bad.value.code, bad.value.param) == ("unsupported_parameter", "dimensions")
