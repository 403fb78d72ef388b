"""llama-server's ``POST /completion`` (and ``/completions``): its native completion route, on the
completions path (admission, keys, classes), answered in llama-server's shapes: one completion
object (an array for several prompts), or ``data:`` frames without ``[DONE]``.

In process: the real ASGI application and worker code around the simulated engine; one
end-to-end check on the shared real server against ``/v1/completions``."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from django.test import override_settings
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.errors import ApiError
from api.schemas import parse_native_completion_request
from keys.credentials import digest_of
from keys.runtime import Key, Policy
from scheduler.engines.sim import SimEngine
from tests.edge.inproc import JSON, MODEL, SimWorker, attached, request
from tests.edge.strategies import field_values

pytestmark_db = pytest.mark.django_db(transaction=True)


def parse(body: dict[str, Any], *, strict: bool = False) -> Any:
    return parse_native_completion_request(json.dumps(body).encode(), models=[MODEL], strict=strict)


def body(**fields: Any) -> bytes:
    return json.dumps({"prompt": "Once upon a time", "n_predict": 6, **fields}).encode()


# -- parsing ------------------------------------------------------------------------------------


def test_the_body_maps_onto_a_completion_with_llama_servers_fields() -> None:
    req, options = parse({"prompt": "a", "n_predict": 5, "temperature": 0, "top_k": 3, "stop": ["x"], "samplers": ["top_k"], "id_slot": 0, "response_fields": ["content"]})
    assert (req.model, req.prompt, req.prompts, req.max_tokens, req.temperature, req.top_k, req.stop, req.n) == (MODEL, "a", None, 5, 0.0, 3, ["x"], 1)
    assert req.suffix is None and options.response_fields == ["content"] and not options.return_tokens  # not a FIM prompt: its class is the request's
    assert set(req.ignored) == {"samplers", "id_slot"}


def test_token_ids_and_several_prompts() -> None:
    assert parse({"prompt": [1, 2, 3]})[0].prompt == [1, 2, 3]
    req, _ = parse({"prompt": ["a", [4, 5]]})
    assert req.prompt == "a" and req.prompts == ["a", [4, 5]]


def test_a_prompt_mixing_strings_and_token_ids_is_tokenised_as_llama_servers_tokenize_mixed() -> None:
    """Strings with special tokens parsed, BOS only for a string that begins the prompt."""
    calls: list[tuple[str, str, bool]] = []

    def tokenize(model: str, text: str, first: bool) -> list[int]:
        calls.append((model, text, first))
        return ([1] if first else []) + [ord(c) for c in text]

    def mixed(prompt: Any) -> Any:
        req, _ = parse_native_completion_request(json.dumps({"prompt": prompt}).encode(), models=[MODEL], tokenize=tokenize)
        return req.prompts or req.prompt

    assert mixed(["ab", 5, "c"]) == [1, 97, 98, 5, 99]
    assert mixed([5, "c"]) == [5, 99]
    assert mixed(["x", ["ab", 7], [8, 9]]) == ["x", [1, 97, 98, 7], [8, 9]]
    assert calls[0] == (MODEL, "ab", True)
    assert mixed("ab") == "ab" and mixed([3, 4]) == [3, 4]  # not mixed: as on /v1/completions
    with pytest.raises(ApiError) as err:
        mixed(["ab", 5, None])
    assert err.value.body()["error"]["param"] == "prompt"


def test_unhonoured_llama_server_samplers_are_accepted_under_strict_and_named_ignored() -> None:
    req, _ = parse({"prompt": "a", "mirostat": 2, "n_probs": 3, "cache_prompt": True}, strict=True)
    assert set(req.ignored) == {"mirostat"} and req.logprobs == 3  # n_probs is honoured
    with pytest.raises(ApiError):
        parse({"prompt": "a", "no_such_field": 1}, strict=True)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({}, "prompt"),
        ({"prompt": 3}, "prompt"),
        ({"prompt": "a", "response_fields": "content"}, "response_fields"),
        ({"prompt": "a", "n_predict": "5"}, "n_predict"),
        ({"prompt": "a", "temperature": -1}, "temperature"),
        ({"prompt": "a", "model": "other"}, "model"),
        ({"prompt": "a", "n_indent": -1}, "n_indent"),
        ({"prompt": "a", "n_probs": 21}, "n_probs"),
        ({"prompt": "a", "n_probs": "2"}, "n_probs"),
    ],
)
def test_bad_fields_are_errors_naming_the_param(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as err:
        parse(fields)
    assert err.value.status in (400, 404) and err.value.body()["error"]["param"] == param


json_values = field_values()
native_keys = st.sampled_from(
    ["prompt", "n_predict", "temperature", "stop", "stream", "seed", "top_k", "model", "samplers", "n", "n_probs", "response_fields", "n_indent", "logit_bias"]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(native_keys, json_values, max_size=6))
def test_fuzzed_bodies_parse_or_are_400s_naming_a_param_they_hold(body: dict[str, Any]) -> None:
    def tokenize(model: str, text: str, first: bool) -> list[int]:
        return list(text.encode())

    try:
        req, _options = parse_native_completion_request(json.dumps(body).encode(), models=[MODEL], tokenize=tokenize)
    except ApiError as exc:
        error = exc.body()["error"]
        assert exc.status in (400, 404), error
        named = error["param"] is None or error["param"].split("[")[0].split(".")[0] in body
        assert named or error["code"] == "missing_required_parameter", error
        return
    for prompt in req.prompts or [req.prompt]:
        assert isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt))
    assert req.n == (body.get("n") or 1) and req.suffix is None  # n: llama-server's n_cmpl alias
    json.dumps(req.to_wire())  # what goes over the link


# -- through the application --------------------------------------------------------------------


@pytestmark_db
@pytest.mark.parametrize("path", ["/completion", "/completions"])
async def test_completion_answers_llama_servers_completion_object(path: str) -> None:
    async with attached(SimWorker()):
        reply = await request("POST", path, body(seed=7, stop=["zzz"]), JSON)
        openai = await request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 6}).encode(), JSON)
    assert reply.status == 200, reply.body
    obj = reply.json()
    assert obj["content"] == openai.json()["choices"][0]["text"] and len(obj["content"]) > 0
    assert obj["stop"] is True and obj["model"] == MODEL and obj["truncated"] is False and obj["index"] == 0
    assert obj["tokens_predicted"] == 6 and obj["tokens_evaluated"] == openai.json()["usage"]["prompt_tokens"]
    assert obj["stop_type"] == "limit" and obj["stopping_word"] == "" and obj["prompt"] == "Once upon a time"
    settings = obj["generation_settings"]
    assert settings["n_predict"] == 6 and settings["seed"] == 7 and settings["stop"] == ["zzz"]
    assert obj["timings"]["predicted_n"] == 6
    assert not reply.body.startswith(b"data:")
    assert reply.headers["x-superfluid-qos"] == openai.headers["x-superfluid-qos"]  # the class of /v1/completions


@pytestmark_db
async def test_a_stop_string_is_stop_type_word_with_its_stopping_word() -> None:
    async with attached(SimWorker()):
        first = (await request("POST", "/completion", body(n_predict=8), JSON)).json()["content"]
        word = first[2:4]
        obj = (await request("POST", "/completion", body(n_predict=8, stop=[word]), JSON)).json()
    assert obj["stop_type"] == "word" and obj["stopping_word"] == word and obj["content"] == first[: first.index(word)]


@pytestmark_db
async def test_streamed_completion_sends_content_frames_then_a_stop_frame_and_no_done() -> None:
    async with attached(SimWorker()):
        whole = (await request("POST", "/completion", body(), JSON)).json()["content"]
        reply = await request("POST", "/completion", body(stream=True), JSON)
        picked = await request("POST", "/completion", body(stream=True, response_fields=["content", "stop", "timings/predicted_n"]), JSON)
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/event-stream")
    frames = [json.loads(d) for d in reply.sse_data()]  # json.loads: no [DONE]
    *deltas, last = frames
    assert deltas and all(f["stop"] is False and f["content"] and f["index"] == 0 for f in deltas)
    assert "".join(f["content"] for f in deltas) == whole
    assert deltas[-1]["tokens_predicted"] == 6 and deltas[0]["tokens_evaluated"] > 0
    assert last["stop"] is True and last["content"] == "" and last["tokens_predicted"] == 6 and "generation_settings" in last
    assert not reply.body.rstrip().endswith(b"[DONE]")
    assert json.loads(picked.sse_data()[-1]) == {"content": "", "stop": True, "timings/predicted_n": 6}


@pytestmark_db
async def test_response_fields_return_only_those_keyed_by_their_path() -> None:
    async with attached(SimWorker()):
        obj = (await request("POST", "/completion", body(response_fields=["content", "generation_settings/n_predict", "nope"]), JSON)).json()
    assert set(obj) == {"content", "generation_settings/n_predict"} and obj["generation_settings/n_predict"] == 6


@pytestmark_db
async def test_several_prompts_answer_an_array_of_results_in_order_and_streams_index_them() -> None:
    async with attached(SimWorker()):
        one = [(await request("POST", "/completion", body(prompt=p), JSON)).json()["content"] for p in ("ab", "xyz")]
        both = await request("POST", "/completion", body(prompt=["ab", "xyz"]), JSON)
        streamed = await request("POST", "/completion", body(prompt=["ab", "xyz"], stream=True), JSON)
    assert both.status == 200, both.body
    results = both.json()
    assert isinstance(results, list) and [r["index"] for r in results] == [0, 1]
    assert [r["content"] for r in results] == one and [r["prompt"] for r in results] == ["ab", "xyz"]
    frames = [json.loads(d) for d in streamed.sse_data()]
    for i in (0, 1):
        mine = [f for f in frames if f["index"] == i]
        assert "".join(f["content"] for f in mine) == one[i] and mine[-1]["stop"] is True
    assert not streamed.body.rstrip().endswith(b"[DONE]")


@pytestmark_db
async def test_a_token_id_prompt_is_completed_as_on_v1_completions() -> None:
    async with attached(SimWorker()):
        native = await request("POST", "/completion", body(prompt=[72, 105, 33]), JSON)
        openai = await request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": [72, 105, 33], "max_tokens": 6}).encode(), JSON)
    assert native.status == 200, native.body
    obj = native.json()
    assert obj["content"] == openai.json()["choices"][0]["text"] and obj["tokens_evaluated"] == 3
    assert isinstance(obj["prompt"], str)


@pytestmark_db
async def test_a_mixed_prompt_is_completed_as_its_tokens_are(monkeypatch: pytest.MonkeyPatch) -> None:
    from api.consumers import NativeCompletionConsumer

    # the simulated engine's vocabulary: a token a byte (the web process reads the bundled model's)
    monkeypatch.setattr(NativeCompletionConsumer, "tokenize", staticmethod(lambda model, text, first: list(text.encode())))
    ids = list(b"Hello")
    async with attached(SimWorker()):
        mixed = await request("POST", "/completion", body(prompt=["Hello", 33]), JSON)
        tokens = await request("POST", "/completion", body(prompt=[*ids, 33]), JSON)
    assert mixed.status == 200, mixed.body
    assert mixed.json()["content"] == tokens.json()["content"] and mixed.json()["tokens_evaluated"] == len(ids) + 1


@pytestmark_db
async def test_a_token_id_outside_the_vocabulary_is_the_workers_400_not_a_500() -> None:
    """The result's ``prompt`` is a token-id prompt's text: an id the vocabulary does not have
    failed that lookup, a 500, before the worker could refuse the prompt as it does on
    /v1/completions."""
    async with attached(SimWorker()):
        native = await request("POST", "/completion", body(prompt=[60_000_000]), JSON)
        openai = await request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": [60_000_000], "max_tokens": 3}).encode(), JSON)
    assert native.status == 400 and native.is_error_object(), native.body
    assert native.json()["error"] == openai.json()["error"]


# what SillyTavern's llama.cpp backend sends (public/scripts/textgen-settings.js): an empty
# grammar field with every request, its sampler options, seed -1
SILLYTAVERN = {
    "n_predict": 6, "temperature": 0.7, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "typical_p": 1, "repeat_penalty": 1.1,
    "repeat_last_n": 64, "presence_penalty": 0, "frequency_penalty": 0, "mirostat": 0, "mirostat_tau": 5, "mirostat_eta": 0.1,
    "grammar": "", "n_probs": 10, "min_keep": 0, "stop": ["\nUser:"], "stream": True, "seed": -1, "ignore_eos": False,
    "logit_bias": [], "cache_prompt": True, "samplers": ["top_k", "typ_p", "top_p", "min_p", "temperature"], "dry_multiplier": 0,
    "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 0, "dry_sequence_breakers": ["\n", ":"], "xtc_threshold": 0.1,
    "xtc_probability": 0, "dynatemp_range": 0, "dynatemp_exponent": 1, "n_keep": -1, "top_n_sigma": 0, "tfs_z": 1, "top_a": 0,
}  # fmt: skip


def test_an_empty_grammar_is_none_as_llama_server_reads_it() -> None:
    """SillyTavern's llama.cpp backend sends ``"grammar": ""`` with every request: it was a 400
    (expected a non-empty grammar), so nothing it asked was answered."""
    req, _ = parse({"prompt": "a", "grammar": ""})
    assert req.response_format is None
    both, _ = parse({"prompt": "a", "grammar": "", "json_schema": {"type": "object"}})
    assert both.response_format == {"type": "json_schema", "schema": {"type": "object"}, "strict": True}
    with pytest.raises(ApiError):
        parse({"prompt": "a", "grammar": "   "})  # a grammar of blanks is no grammar written


@pytestmark_db
async def test_a_sillytavern_request_is_served() -> None:
    async with attached(SimWorker()):
        reply = await request("POST", "/completion", json.dumps({"prompt": "User: hi\nAssistant:", **SILLYTAVERN, "n_probs": 0}).encode(), JSON)
    assert reply.status == 200, reply.body
    frames = [json.loads(d) for d in reply.sse_data()]
    assert frames[-1]["stop"] is True and frames[-1]["tokens_predicted"] >= 1
    assert {"tfs_z", "top_a", "mirostat", "samplers"} <= {p.strip() for p in reply.headers["x-superfluid-ignored-params"].split(",")}


@pytestmark_db
async def test_ignored_fields_are_named_in_the_header() -> None:
    async with attached(SimWorker()):
        reply = await request("POST", "/completion", body(samplers=["top_k"], mirostat=2), JSON)
    assert reply.status == 200
    assert {p.strip() for p in reply.headers["x-superfluid-ignored-params"].split(",")} == {"samplers", "mirostat"}


@pytestmark_db
async def test_bad_bodies_are_400s_in_the_error_shape_and_the_route_keeps_serving() -> None:
    bad = [(b"{not json", None), (json.dumps({"n_predict": 3}).encode(), "prompt"), (json.dumps({"prompt": "a", "stop": 3}).encode(), "stop")]
    async with attached(SimWorker()):
        for raw, param in bad:
            reply = await request("POST", "/completion", raw, JSON)
            assert reply.status == 400 and reply.is_error_object(), reply.body
            assert reply.json()["error"]["param"] == param
        get = await request("GET", "/completion")
        after = await request("POST", "/completion", body(), JSON)
    assert get.status == 405 and get.is_error_object()
    assert after.status == 200 and after.json()["tokens_predicted"] == 6


class LogprobSim(SimEngine):
    """The simulated engine reporting logprobs: each sampled token -0.5, its alternatives lower."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.features = frozenset({"logprobs"})
        self.want: dict[int, int] = {}
        self.lp_out: dict[int, tuple[float, list[tuple[int, float]]]] = {}

    def bind_sampler(self, bind: Any) -> None:
        super().bind_sampler(bind)
        self.want[bind.lane] = bind.sampling.logprobs or 0

    def forward(self, step: Any) -> dict[int, int]:
        sampled = super().forward(step)
        for lane, token in sampled.items():
            self.lp_out[lane] = (-0.5, [(token, -0.5), ((token + 1) % 256, -1.5), ((token + 2) % 256, -2.5)][: self.want.get(lane, 0)])
        return sampled

    def take_logprobs(self) -> dict[int, tuple[float, list[tuple[int, float]]]]:
        out, self.lp_out = self.lp_out, {}
        return out


class LogprobWorker(SimWorker):
    engine_class = LogprobSim


@pytestmark_db
async def test_n_probs_gives_completion_probabilities_for_each_generated_token_streamed_or_not() -> None:
    async with attached(LogprobWorker()):
        whole = await request("POST", "/completion", body(n_probs=2), JSON)
        streamed = await request("POST", "/completion", body(n_probs=2, stream=True), JSON)
        plain = await request("POST", "/completion", body(), JSON)
    assert whole.status == 200, whole.body
    obj = whole.json()
    probs = obj["completion_probabilities"]
    assert len(probs) == obj["tokens_predicted"] == 6 and "".join(p["token"] for p in probs) == obj["content"]
    for p in probs:
        assert set(p) == {"id", "token", "bytes", "logprob", "top_logprobs"} and p["logprob"] == -0.5
        assert [t["logprob"] for t in p["top_logprobs"]] == [-0.5, -1.5] and p["top_logprobs"][0]["id"] == p["id"]
        assert bytes(p["bytes"]).decode() == p["token"]
    assert obj["generation_settings"]["n_probs"] == 2 and "x-superfluid-ignored-params" not in whole.headers
    frames = [json.loads(d) for d in streamed.sse_data()]
    assert [p for f in frames for p in f.get("completion_probabilities", [])] == probs
    assert all(len(f["completion_probabilities"]) >= 1 for f in frames[:-1])
    assert "completion_probabilities" not in plain.json()


@pytestmark_db
async def test_return_tokens_gives_the_generated_token_ids_streamed_or_not() -> None:
    async with attached(LogprobWorker()):
        whole = await request("POST", "/completion", body(return_tokens=True), JSON)
        streamed = await request("POST", "/completion", body(return_tokens=True, stream=True), JSON)
        both = await request("POST", "/completion", body(return_tokens=True, n_probs=1), JSON)
        plain = await request("POST", "/completion", body(), JSON)
    assert whole.status == 200, whole.body
    obj = whole.json()
    assert obj["tokens"] == list(obj["content"].encode()) and len(obj["tokens"]) == 6  # the simulated vocabulary: a token a byte
    assert "completion_probabilities" not in obj and obj["generation_settings"]["n_probs"] == 0
    assert "x-superfluid-ignored-params" not in whole.headers
    frames = [json.loads(d) for d in streamed.sse_data()]
    assert [t for f in frames for t in f["tokens"]] == obj["tokens"]
    assert all(f["tokens"] == list(f["content"].encode()) for f in frames[:-1])
    assert both.json()["tokens"] == [p["id"] for p in both.json()["completion_probabilities"]] == obj["tokens"]
    assert plain.json()["tokens"] == []


RESTRICTED, OPEN = "sf-restricted-0123456789", "sf-open-0123456789"


def keyed(secret: str) -> list[tuple[bytes, bytes]]:
    return [*JSON, (b"authorization", f"Bearer {secret}".encode())]


@pytestmark_db
@override_settings(SUPERFLUID_KEYS_REQUIRED=True)
async def test_completion_is_admitted_as_any_generation_request_keys_first() -> None:
    restricted = Key(id=1, name="restricted", digest=digest_of(RESTRICTED), policy=Policy(name="p", allowed_models=("other",)))
    everything = Key(id=2, name="open", digest=digest_of(OPEN), policy=Policy(name="q"))
    async with attached(SimWorker(), keys={restricted.digest: restricted, everything.digest: everything}):
        missing = await request("POST", "/completion", body(), JSON)
        wrong = await request("POST", "/completion", body(), keyed("sf-not-a-key-0123456789"))
        other = await request("POST", "/completion", body(), keyed(RESTRICTED))
        ok = await request("POST", "/completion", body(), keyed(OPEN))
    assert missing.status == 401 and wrong.status == 401 and missing.is_error_object()
    assert other.status == 403 and other.json()["error"]["code"] == "model_forbidden"  # as /v1/completions answers it
    assert ok.status == 200 and ok.json()["tokens_predicted"] == 6


@pytestmark_db
async def test_the_class_and_priority_headers_choose_its_class_as_on_v1_completions() -> None:
    async with attached(SimWorker()):
        background = await request("POST", "/completion", body(), [*JSON, (b"x-superfluid-qos", b"background")])
        low = await request("POST", "/completion", body(), [*JSON, (b"x-llamaswap-priority", b"-100")])
        bad = await request("POST", "/completion", body(), [*JSON, (b"x-superfluid-qos", b"nope")])
    assert background.status == 200 and background.headers["x-superfluid-qos"] == "background"
    assert low.status == 200 and low.headers["x-superfluid-qos"] == "background"
    assert bad.status == 400 and bad.json()["error"]["code"] == "invalid_qos_class"


@pytestmark_db
@override_settings(SUPERFLUID_MAX_BODY_BYTES=1000)
async def test_a_body_over_the_bound_is_413() -> None:
    async with attached(SimWorker()):
        big = await request("POST", "/completion", body(prompt="x" * 2000), JSON)
    assert big.status == 413 and big.is_error_object()


# -- the real server ----------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.model
def test_the_real_server_completion_at_temperature_0_equals_v1_completions(shared_server: Any) -> None:
    prompt = "The capital of France is"
    native = httpx.post(shared_server.base + "/completion", json={"prompt": prompt, "n_predict": 12, "temperature": 0}, timeout=120)
    model = httpx.get(shared_server.base + "/v1/models", timeout=60).json()["data"][0]["id"]
    openai = httpx.post(shared_server.base + "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 12, "temperature": 0}, timeout=120)
    assert native.status_code == 200, native.text
    assert openai.status_code == 200, openai.text
    obj = native.json()
    assert obj["content"] == openai.json()["choices"][0]["text"] and obj["content"]
    assert obj["tokens_evaluated"] == openai.json()["usage"]["prompt_tokens"]
    assert obj["tokens_predicted"] == openai.json()["usage"]["completion_tokens"]
    # n_probs: each generated token's probabilities, the top ones of the same model
    probs = httpx.post(shared_server.base + "/completion", json={"prompt": prompt, "n_predict": 6, "temperature": 0, "n_probs": 3}, timeout=120).json()
    entries = probs["completion_probabilities"]
    assert "".join(e["token"] for e in entries) == probs["content"] and len(entries) == probs["tokens_predicted"]
    assert all(len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["id"] == e["id"] for e in entries)  # greedy: the top one
    # return_tokens: the generated token ids, whose text is the content
    returned = httpx.post(shared_server.base + "/completion", json={"prompt": prompt, "n_predict": 6, "temperature": 0, "return_tokens": True}, timeout=120).json()
    text = httpx.post(shared_server.base + "/detokenize", json={"tokens": returned["tokens"]}, timeout=60).json()["content"]
    assert text == returned["content"] == obj["content"][: len(text)] and len(returned["tokens"]) == returned["tokens_predicted"]
    # a prompt mixing text and token ids: the text tokenised as /tokenize does (BOS and all)
    ids = httpx.post(shared_server.base + "/tokenize", json={"content": prompt, "add_special": True}, timeout=60).json()["tokens"]
    mixed = httpx.post(shared_server.base + "/completion", json={"prompt": [prompt, 13], "n_predict": 8, "temperature": 0}, timeout=120)
    tokens = httpx.post(shared_server.base + "/completion", json={"prompt": [*ids, 13], "n_predict": 8, "temperature": 0}, timeout=120)
    assert mixed.status_code == 200, mixed.text
    assert mixed.json()["content"] == tokens.json()["content"] and mixed.json()["tokens_evaluated"] == len(ids) + 1


@pytestmark_db
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("n_predict", [0, 1, 6])
async def test_tokens_cached_is_llama_servers_n_past_without_the_last_sampled_token(stream: bool, n_predict: int) -> None:
    """llama-server's ``tokens_cached`` is its slot's tokens when the reply ends: the prompt and
    the generated tokens but the last, which it sampled and never decoded (5 + 3 - 1 = 7 for a
    5-token prompt and ``n_predict`` 3, whatever stopped it: measured on llama-server of the
    wheel's llama.cpp). It was one more here."""
    async with attached(SimWorker()):
        reply = await request("POST", "/completion", body(n_predict=n_predict, stream=stream), JSON)
    assert reply.status == 200, reply.body
    obj = json.loads(reply.sse_data()[-1]) if stream else reply.json()
    assert obj["tokens_predicted"] == max(n_predict, 1)
    assert obj["tokens_cached"] == obj["tokens_evaluated"] + obj["tokens_predicted"] - 1
