"""The routes that read a model's vocabulary in the web process (/tokenize, /detokenize,
/apply-template, /completion's prompt mixing strings and token ids) for a model whose file cannot
be read: one cut short, replaced or removed since serve checked it (with several models, the
model a generation request is answered 503 ``engine_unavailable`` for, its load failing).

Seen on a real server with a truncated GGUF in its config: each of these routes answered a bare
500 ("The server had an error while processing your request.", nothing in serve's log for the
three Django views), and /tokenize and /detokenize spent the key's rate token on it, so a key at
one request a minute got 429 for its next call. Now they answer as a generation request for that
model is answered (503 ``engine_unavailable`` naming the model) and give the rate token back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import override_settings

from keys.credentials import digest_of
from keys.runtime import Key, Policy
from scheduler.core.qos import QosClass
from scheduler.engines.models import default_model_path
from tests.edge.inproc import JSON, SimWorker, attached, request

pytestmark = pytest.mark.django_db(transaction=True)

RATED = "sk-vocab-rated-0123456789"
KEYS = {digest_of(RATED): Key(id=1, name="rated", digest=digest_of(RATED), policy=Policy(name="r", max_class=QosClass.INTERACTIVE, rate_limit_rpm=1))}
AUTH = [*JSON, (b"authorization", f"Bearer {RATED}".encode())]

CALLS = [
    ("/tokenize", {"content": "hello"}),
    ("/detokenize", {"tokens": [1, 2]}),
    ("/apply-template", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/completion", {"prompt": ["hi", 1], "n_predict": 1}),
]


@pytest.fixture
def cut_short(tmp_path: Path) -> Path:
    """The bundled GGUF's first 2 MB: a header whose key-value pairs end early."""
    path = tmp_path / "cut.gguf"
    with open(default_model_path(), "rb") as f:
        path.write_bytes(f.read(2_000_000))
    return path


@pytest.mark.parametrize(("path", "body"), CALLS, ids=[c[0] for c in CALLS])
async def test_a_model_whose_file_cannot_be_read_is_503_engine_unavailable(cut_short: Path, path: str, body: dict[str, object]) -> None:
    with override_settings(SUPERFLUID_MODEL_PATH=str(cut_short)):
        async with attached(SimWorker()):
            reply = await request("POST", path, json.dumps(body).encode(), JSON)
    assert reply.status == 503 and reply.is_error_object(), reply.body
    error = reply.json()["error"]
    assert error["code"] == "engine_unavailable" and error["type"] == "server_error"
    assert "could not be loaded" in error["message"] and str(cut_short) not in error["message"]


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize", "/apply-template"])
async def test_the_503_gives_the_keys_rate_token_back(cut_short: Path, path: str) -> None:
    """At one request a minute, the second call is the server's 503 again, not a 429: the
    failure was the server's, as for a generation request refused before any engine saw it."""
    body = json.dumps(dict(CALLS)[path]).encode()
    with override_settings(SUPERFLUID_MODEL_PATH=str(cut_short)):
        async with attached(SimWorker(), keys=KEYS):
            first = await request("POST", path, body, AUTH)
            second = await request("POST", path, body, AUTH)
    assert (first.status, second.status) == (503, 503), (first.body, second.body)
