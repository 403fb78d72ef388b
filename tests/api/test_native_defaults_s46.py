"""llama-server's native routes (/completion, /infill) as llama-server's clients count on them:
an absent sampling parameter is llama-server's default (temperature 0.8, top_k 40, top_p 0.95,
min_p 0.05: common/common.h, common_params_sampling), which /props says; the OpenAI routes keep
OpenAI's (temperature 1, no top-k, top-p or min-p). Timings carry llama-server's ``cache_n``.

In process: the real ASGI application and worker code around the simulated engine."""

from __future__ import annotations

import json
from typing import Any

import pytest

from api.responses import native_generation_settings
from api.schemas import parse_completion_request, parse_infill_request, parse_native_completion_request
from scheduler.engines.sim import SimEngine
from tests.api.test_infill import FimSim
from tests.edge.inproc import JSON, MODEL, SimWorker, attached, request

pytestmark_db = pytest.mark.django_db(transaction=True)

LLAMA_SERVER = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
OPENAI = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


def sampling(req: Any) -> dict[str, Any]:
    return {name: getattr(req, name) for name in LLAMA_SERVER}


def test_an_absent_sampling_parameter_is_llama_servers_default_on_its_routes_and_openais_on_v1() -> None:
    native, _ = parse_native_completion_request(json.dumps({"prompt": "a"}).encode(), models=[MODEL])
    infill, _ = parse_infill_request(json.dumps({"input_prefix": "a"}).encode(), models=[MODEL])
    v1 = parse_completion_request(json.dumps({"model": MODEL, "prompt": "a"}).encode(), models=[MODEL])
    assert sampling(native) == LLAMA_SERVER and sampling(infill) == LLAMA_SERVER
    assert sampling(v1) == OPENAI
    given, _ = parse_native_completion_request(json.dumps({"prompt": "a", "temperature": 0, "top_k": 0, "top_p": 1, "min_p": 0}).encode(), models=[MODEL])
    assert sampling(given) == {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}  # what is given is kept


class Recording(SimEngine):
    """The simulated engine, keeping the sampling each job was bound with."""

    bound: list[Any] = []

    def bind_sampler(self, bind: Any) -> None:
        super().bind_sampler(bind)
        Recording.bound.append(bind.sampling)


class RecordingWorker(SimWorker):
    engine_class = Recording


class RecordingFim(FimSim):
    def bind_sampler(self, bind: Any) -> None:
        super().bind_sampler(bind)
        Recording.bound.append(bind.sampling)


class RecordingFimWorker(SimWorker):
    engine_class = RecordingFim


@pytestmark_db
async def test_completion_without_sampling_parameters_samples_as_llama_server_would() -> None:
    Recording.bound = []
    async with attached(RecordingWorker()):
        native = await request("POST", "/completion", json.dumps({"prompt": "Once upon a time", "n_predict": 3}).encode(), JSON)
        v1 = await request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3}).encode(), JSON)
        props = await request("GET", "/props")
    assert native.status == 200 and v1.status == 200, (native.body, v1.body)
    assert [sampling(s) for s in Recording.bound] == [LLAMA_SERVER, OPENAI]
    settings = native.json()["generation_settings"]
    assert {name: settings[name] for name in LLAMA_SERVER} == LLAMA_SERVER
    params = props.json()["default_generation_settings"]["params"]
    assert {name: params[name] for name in LLAMA_SERVER} == LLAMA_SERVER


@pytestmark_db
async def test_infill_without_sampling_parameters_samples_as_llama_server_would() -> None:
    """llama.vim sends top_k and top_p but no temperature: llama-server samples it at 0.8."""
    Recording.bound = []
    async with attached(RecordingFimWorker()):
        reply = await request("POST", "/infill", json.dumps({"input_prefix": "def f():\n    ", "input_suffix": "\n", "n_predict": 3, "top_k": 40, "top_p": 0.99}).encode(), JSON)
    assert reply.status == 200, reply.body
    assert [sampling(s) for s in Recording.bound] == [{**LLAMA_SERVER, "top_p": 0.99}]


@pytestmark_db
async def test_timings_say_the_prompt_tokens_taken_from_the_cache_as_llama_servers_cache_n() -> None:
    """llama-server's timings hold ``cache_n`` (the prompt tokens reused from the cache) beside
    ``prompt_n`` (those computed): a client adding them up for the prompt read a KeyError."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 4
    async with attached(SimWorker(lanes=1)):
        first = (await request("POST", "/completion", json.dumps({"prompt": prompt, "n_predict": 3, "temperature": 0}).encode(), JSON)).json()
        again = (await request("POST", "/completion", json.dumps({"prompt": prompt, "n_predict": 3, "temperature": 0}).encode(), JSON)).json()
        v1 = (await request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 3, "temperature": 0}).encode(), JSON)).json()
    assert first["timings"]["cache_n"] == 0 and first["timings"]["prompt_n"] == first["tokens_evaluated"]
    cached = v1["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0 and again["timings"]["cache_n"] == cached
    assert again["timings"]["cache_n"] + again["timings"]["prompt_n"] == again["tokens_evaluated"]



@pytestmark_db
async def test_generation_settings_seed_and_logit_bias_are_typed_as_llama_servers() -> None:
    """llama-server's ``seed`` is the sampler's unsigned 32 bits (4294967295 when none is given)
    and its ``logit_bias`` ``[{"bias", "token"}]``: a client decoding them into those types (a Go
    uint32, a Rust u32, a struct) failed on superfluid's -1 and ``[[token, bias]]``."""
    async with attached(SimWorker()):
        none = (await request("POST", "/completion", json.dumps({"prompt": "a", "n_predict": 2}).encode(), JSON)).json()
        given = (await request("POST", "/completion", json.dumps({"prompt": "a", "n_predict": 2, "seed": -1}).encode(), JSON)).json()
        big = (await request("POST", "/completion", json.dumps({"prompt": "a", "n_predict": 2, "seed": 2**32 + 7}).encode(), JSON)).json()
    assert none["generation_settings"]["seed"] == 4294967295 and none["generation_settings"]["logit_bias"] == []
    assert given["generation_settings"]["seed"] == 4294967295
    assert big["generation_settings"]["seed"] == 7  # the low 32 bits, as the engine is seeded
    # (the simulated engine takes no logit_bias: the settings of a parsed request)
    biased, _ = parse_native_completion_request(json.dumps({"prompt": "a", "logit_bias": [[65, -2.5], [66, False]]}).encode(), models=[MODEL])
    assert native_generation_settings(biased)["logit_bias"] == [{"bias": -2.5, "token": 65}, {"bias": -100.0, "token": 66}]
