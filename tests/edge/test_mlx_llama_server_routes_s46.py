"""llama-server's own routes on an MLX model folder, in process (tests/edge/test_mlx_in_process.py's
worker): /props' chat template, /tokenize and /apply-template from the folder's tokenizer files
in the web process, /completion's n_probs and return_tokens from the MLX engine's logprobs, and
the same rendered prompt and token ids as the GGUF the folder was converted from."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from superfluid_site.serving import installed, serving

from .inproc import JSON, request
from .test_mlx_in_process import MlxWorker
from .test_mlx_in_process import serving as served

pytestmark = [pytest.mark.model, pytest.mark.django_db(transaction=True)]

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi <|im_end|>"}]


@pytest.fixture
def mlx(mlx_float_dir: Path) -> Iterator[MlxWorker]:
    worker = MlxWorker(mlx_float_dir)
    # the web process reads the served folder's vocabulary, as serve --model <folder> installs it
    with installed(dataclasses.replace(serving(), model_path=str(mlx_float_dir), model_paths=())):
        yield worker
    worker.close()


def post(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


async def test_props_tokenize_and_apply_template_read_the_mlx_folder(mlx: MlxWorker, mlx_float_dir: Path) -> None:
    from api.tokenizer import vocab_for
    from scheduler.engines.models import default_model_path
    from scheduler.engines.template_caps import chat_template_caps

    gguf = vocab_for(default_model_path())
    async with served(mlx):
        props = (await request("GET", "/props")).json()
        tokens = await request("POST", "/tokenize", post(content="hi <|im_end|>", with_pieces=True), JSON)
        text = await request("POST", "/detokenize", post(tokens=[1, 28120]), JSON)
        rendered = await request("POST", "/apply-template", post(messages=CHAT, tools=[TOOL]), JSON)
    assert props["engine"] == "mlx" and props["chat_template"] == gguf.template_parts()[0]
    assert props["chat_template_caps"] == chat_template_caps(props["chat_template"])  # the folder's template's
    assert tokens.status == 200, tokens.body
    assert [t["id"] for t in tokens.json()["tokens"]] == gguf.tokenize("hi <|im_end|>", add_special=False, parse_special=True)
    assert tokens.json()["tokens"][-1]["piece"] == "<|im_end|>"
    assert text.json() == {"content": "<|im_start|>hello"}
    assert rendered.status == 200, rendered.body
    prompt = rendered.json()["prompt"]
    assert prompt.startswith("<|im_start|>system\nBe brief.") and "get_weather" in prompt and prompt.endswith("<|im_start|>assistant\n")


async def test_completion_gives_n_probs_and_token_ids_on_mlx(mlx: MlxWorker) -> None:
    body = post(prompt="The capital of France is", n_predict=3, temperature=0, n_probs=2, return_tokens=True)
    async with served(mlx):
        reply = await request("POST", "/completion", body, JSON, timeout_s=300)
    assert reply.status == 200, reply.body
    data = reply.json()
    probs = data["completion_probabilities"]
    assert len(data["tokens"]) == len(probs) == data["tokens_predicted"] == 3
    assert [p["id"] for p in probs] == data["tokens"]
    assert all(len(p["top_logprobs"]) == 2 and p["top_logprobs"][0]["id"] == p["id"] for p in probs)  # greedy: the top one
    assert "".join(p["token"] for p in probs) == data["content"]
