"""llama-server's ``POST /infill`` (llama.vim, llama.vscode, Continue's llama.cpp provider): the
prompt's token layout (format_infill's: extra chunks, BOS, FIM_PRE prefix prompt, FIM_SUF suffix,
FIM_MID), the native response shapes, ``response_fields``, and its refusals.

In process: the real ASGI application and worker code around the simulated engine given FIM
tokens (the bundled model has none), through the in-process transport; one end-to-end test on
the shared real server, whose model has no FIM tokens."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.errors import ApiError
from api.responses import pick_fields
from api.schemas import parse_infill_request
from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import Accepted, Message, Submit
from scheduler.worker.loop import EngineWorker
from tests.edge.inproc import JSON, MODEL, SimWorker, attached, request
from tests.edge.strategies import field_values

PRE, SUF, MID, SEP, REP, BOS = 250, 251, 252, 253, 254, 1


class FimSim(SimEngine):
    """The simulated engine with FIM tokens (and, when asked, FIM_SEP/FIM_REP and a BOS)."""

    def __init__(self, *, sep: bool = False, rep: bool = False, bos: bool = False, lane_ctx: int = 512, **kwargs: Any) -> None:
        super().__init__(lane_ctx=lane_ctx, **kwargs)
        self.sep, self.rep, self.bos = sep, rep, bos

    def tokenize(self, text: str, *, add_special: bool = True, special: bool = True, after: int | None = None) -> list[int]:
        return ([BOS] if self.bos and add_special else []) + list(text.encode("utf-8"))

    def fim_tokens(self) -> tuple[int, int, int]:
        return PRE, SUF, MID

    def fim_repo_tokens(self) -> tuple[int | None, int | None]:
        return (SEP if self.sep else None), (REP if self.rep else None)

    def token_bytes(self, token: int) -> bytes:
        return b"" if token >= PRE else bytes([token % 256])  # control tokens: no text


class FimSimWorker(SimWorker):
    """tests/edge/inproc.py's simulated worker, its engine with FIM tokens."""

    engine_class = FimSim


class FakeConn:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    def queue(self, message: Message) -> None:
        self.sent.append(message)


def b(text: str) -> list[int]:
    return list(text.encode())


def parse(body: dict[str, Any]) -> Any:
    return parse_infill_request(json.dumps(body).encode(), models=[MODEL])


def prompt_of(body: dict[str, Any], **engine: Any) -> tuple[list[int], FimSim]:
    """The tokens the worker prefills for an /infill body, parsed as the route parses it."""
    req, _ = parse(body)
    fim = FimSim(n_lanes=2, clock=FakeClock(), **engine)
    worker = EngineWorker(fim, SchedulerConfig(max_batch=2, lane_ctx=fim.lane_ctx), model_name=MODEL, clock=fim.clock)
    tokens, _own, _param, echoed = worker._prompt_tokens(req.to_wire(), "")
    return tokens, fim


# -- the prompt's layout ----------------------------------------------------------------------


def test_prefix_then_the_typed_prompt_then_suffix_with_no_extra_and_no_sep_rep() -> None:
    tokens, _ = prompt_of({"input_prefix": "ab", "prompt": "c", "input_suffix": "z"})
    assert tokens == [PRE, *b("ab"), *b("c"), SUF, *b("z"), MID]


def test_bos_comes_after_the_extra_context_and_before_fim_pre() -> None:
    tokens, _ = prompt_of({"input_prefix": "a", "input_suffix": "z", "input_extra": [{"filename": "f.py", "text": "T"}]}, bos=True, sep=True)
    assert tokens == [SEP, *b("f.py\n"), *b("T"), SEP, *b("filename\n"), BOS, PRE, *b("a"), SUF, *b("z"), MID]


def test_extra_chunks_with_fim_sep_and_fim_rep_use_the_repo_level_pattern() -> None:
    body = {"input_prefix": "P", "input_suffix": "S", "input_extra": [{"filename": "a.py", "text": "x=1"}, {"text": "y"}]}
    tokens, _ = prompt_of(body, sep=True, rep=True)
    extra = [REP, *b("myproject\n"), SEP, *b("a.py\n"), *b("x=1"), SEP, *b("tmp\n"), *b("y"), SEP, *b("filename\n")]
    assert tokens == [*extra, PRE, *b("P"), SUF, *b("S"), MID]


def test_extra_chunks_without_fim_sep_are_separated_by_a_snippet_line() -> None:
    body = {"input_prefix": "P", "input_suffix": "S", "input_extra": [{"filename": "a.py", "text": "x"}, {"filename": "b.py", "text": "y"}]}
    tokens, _ = prompt_of(body)
    snippet = b("\n\n--- snippet ---\n\n")
    assert tokens == [*snippet, *b("x"), *snippet, *b("y"), PRE, *b("P"), SUF, *b("S"), MID]


def test_fim_rep_without_fim_sep_still_names_the_project() -> None:
    tokens, _ = prompt_of({"input_prefix": "P", "input_suffix": "S"}, rep=True)
    assert tokens == [REP, *b("myproject\n"), PRE, *b("P"), SUF, *b("S"), MID]


def test_text_is_tokenised_as_text_not_as_special_tokens() -> None:
    seen: list[tuple[str, bool]] = []

    class Watching(FimSim):
        def tokenize(self, text: str, *, add_special: bool = True, special: bool = True, after: int | None = None) -> list[int]:
            seen.append((text, special))
            return super().tokenize(text, add_special=add_special, special=special, after=after)

    req, _ = parse({"input_prefix": "<|fim_middle|>", "prompt": "p", "input_suffix": "s", "input_extra": [{"filename": "f", "text": "t"}]})
    fim = Watching(n_lanes=2, sep=True, rep=True)
    EngineWorker(fim, SchedulerConfig(max_batch=2, lane_ctx=512), model_name=MODEL, clock=fim.clock)._prompt_tokens(req.to_wire(), "")
    assert seen and all(special is False for text, special in seen if text), seen


def test_extra_context_is_trimmed_from_its_head_to_fit_and_the_fim_prompt_is_kept_whole() -> None:
    """As llama-server's n_extra_take: the chunks fill what the FIM prompt and the completion
    leave of the context, their tail kept."""
    body = {"input_prefix": "P" * 50, "input_suffix": "S" * 50, "n_predict": 100, "input_extra": [{"filename": "f", "text": "x" * 1000}]}
    tokens, fim = prompt_of(body, sep=True)
    core = [PRE, *b("P" * 50), SUF, *b("S" * 50), MID]
    assert tokens[-len(core) :] == core
    assert len(tokens) == fim.lane_ctx - 100
    assert tokens[: -len(core)] == [*b("x" * 1000), SEP, *b("filename\n")][-(fim.lane_ctx - 100 - len(core)) :]


def test_echoed_prompt_count_stays_the_prefix() -> None:
    req, _ = parse({"input_prefix": "ab", "prompt": "cd", "input_suffix": "z"})
    fim = FimSim(n_lanes=2)
    worker = EngineWorker(fim, SchedulerConfig(max_batch=2, lane_ctx=512), model_name=MODEL, clock=fim.clock)
    tokens, own, param, echoed = worker._prompt_tokens(req.to_wire(), "")
    assert tokens[:echoed] == [PRE, *b("ab")] and own == len(tokens) and param == "prompt"


def test_a_model_without_fim_tokens_refuses_infill_as_fim_unsupported() -> None:
    req, _ = parse({"input_prefix": "a", "input_suffix": "b"})
    engine = SimEngine(n_lanes=2, lane_ctx=512, clock=FakeClock())
    worker = EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=512), model_name=MODEL, clock=engine.clock)
    conn = FakeConn()
    worker.handle(conn, Submit(id="j", request=req.to_wire(), qos=1))  # type: ignore[arg-type]
    (refusal,) = [m for m in conn.sent if not isinstance(m, Accepted)]
    assert getattr(refusal, "reason", None) == "fim_unsupported"


# -- parsing ------------------------------------------------------------------------------------


def test_the_body_maps_onto_a_fim_completion() -> None:
    req, fields = parse({"input_prefix": "a", "input_suffix": "b", "prompt": "c", "n_predict": 5, "samplers": ["top_k"], "response_fields": ["content"]})
    assert (req.model, req.prompt, req.suffix, req.fim_prompt, req.fim_extra, req.max_tokens, req.n) == (MODEL, "a", "b", "c", [], 5, 1)
    assert fields == ["content"] and "samplers" in req.ignored
    bare, fields = parse({})
    assert bare.suffix == "" and bare.prompt == "" and fields is None  # still a FIM prompt: its class, its --fim-model


def test_an_empty_model_name_is_none_given_the_served_model_answers() -> None:
    """/infill's model is optional (llama-server's route): an empty name is no name, not a model
    called "" that does not exist."""
    req, _ = parse({"input_prefix": "a", "model": ""})
    assert req.model == MODEL


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens"])
def test_a_token_limit_that_is_honoured_is_not_named_ignored_nor_unknown_under_strict(key: str) -> None:
    """Both names of the limit are read (api.schemas._parse_max_tokens), as on /v1/completions:
    the ignored-parameters header must not name one that took effect, nor --strict-params refuse it."""
    req, _ = parse({"input_prefix": "a", key: 5})
    assert req.max_tokens == 5 and req.ignored == []
    strict, _ = parse_infill_request(json.dumps({"input_prefix": "a", key: 5}).encode(), models={MODEL}, strict=True)
    assert strict.max_tokens == 5


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input_prefix": 1}, "input_prefix"),
        ({"input_suffix": ["x"]}, "input_suffix"),
        ({"prompt": [1, 2]}, "prompt"),
        ({"input_extra": "x"}, "input_extra"),
        ({"input_extra": {"text": "x"}}, "input_extra"),
        ({"input_extra": ["x"]}, "input_extra[0]"),
        ({"input_extra": [{"text": "a"}, {"filename": "f"}]}, "input_extra[1].text"),
        ({"input_extra": [{"text": 3}]}, "input_extra[0].text"),
        ({"input_extra": [{"text": "t", "filename": 3}]}, "input_extra[0].filename"),
        ({"response_fields": "content"}, "response_fields"),
        ({"response_fields": ["content", 1]}, "response_fields"),
        ({"model": "other"}, "model"),
        ({"n_predict": "5"}, "n_predict"),
        ({"temperature": -1}, "temperature"),
    ],
)
def test_bad_fields_are_400s_naming_the_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as err:
        parse(body)
    assert err.value.status in (400, 404) and err.value.body()["error"]["param"] == param


json_values = field_values(st.sampled_from(["text", "filename", "x"]), max_leaves=8)
infill_keys = st.sampled_from(
    ["input_prefix", "input_suffix", "input_extra", "prompt", "response_fields", "n_predict", "temperature", "stop", "stream", "seed", "top_k", "model", "samplers", "n"]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(infill_keys, json_values, max_size=6))
def test_fuzzed_bodies_parse_or_are_400s_naming_a_param_they_hold(body: dict[str, Any]) -> None:
    try:
        req, _fields = parse(body)
    except ApiError as exc:
        error = exc.body()["error"]
        assert exc.status in (400, 404), error
        assert error["param"] is None or error["param"].split("[")[0].split(".")[0] in body, error
        return
    assert isinstance(req.prompt, str) and isinstance(req.suffix, str) and req.n == 1
    assert all(isinstance(f, str) and isinstance(t, str) for f, t in req.fim_extra or [])
    json.dumps(req.to_wire())  # what goes over the link


# -- response_fields ------------------------------------------------------------------------------


def test_pick_fields_keys_values_by_path_and_drops_paths_that_lead_nowhere() -> None:
    obj = {"content": "x", "timings": {"prompt_n": 3}, "stop": True}
    assert pick_fields(obj, ["content", "timings/prompt_n", "timings/nope", "missing"]) == {"content": "x", "timings/prompt_n": 3}
    assert pick_fields(obj, None) is obj and pick_fields(obj, []) is obj


# -- through the application --------------------------------------------------------------------

pytestmark_db = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fim_sim() -> FimSimWorker:
    return FimSimWorker()


def body(**fields: Any) -> bytes:
    return json.dumps({"input_prefix": "def f():\n    ", "input_suffix": "\n", "n_predict": 6, **fields}).encode()


@pytestmark_db
async def test_infill_answers_llama_servers_completion_object(fim_sim: FimSimWorker) -> None:
    async with attached(fim_sim):
        reply = await request("POST", "/infill", body(), JSON)
    assert reply.status == 200, reply.body
    obj = reply.json()
    assert isinstance(obj["content"], str) and len(obj["content"]) == 6
    assert obj["stop"] is True and obj["model"] == MODEL and obj["truncated"] is False
    assert obj["tokens_predicted"] == 6 and obj["tokens_evaluated"] == len(b("def f():\n    ")) + len(b("\n")) + 3
    assert obj["stop_type"] == "limit" and obj["stopping_word"] == ""
    assert set(obj["timings"]) == {
        "cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second",
    }  # fmt: skip
    assert obj["timings"]["predicted_n"] == 6 and obj["timings"]["prompt_n"] == obj["tokens_evaluated"]
    assert reply.headers["x-superfluid-qos"] == "completion"  # the completions path: FIM runs as a completion


@pytestmark_db
async def test_a_stop_string_is_stop_type_word_with_its_stopping_word(fim_sim: FimSimWorker) -> None:
    async with attached(fim_sim):
        first = (await request("POST", "/infill", body(n_predict=8), JSON)).json()["content"]
        word = first[2:4]  # the sim engine is deterministic: the same text comes again
        obj = (await request("POST", "/infill", body(n_predict=8, stop=[word]), JSON)).json()
    assert obj["stop_type"] == "word" and obj["stopping_word"] == word and obj["content"] == first[: first.index(word)]


@pytestmark_db
async def test_response_fields_return_only_those_keyed_by_their_path(fim_sim: FimSimWorker) -> None:
    fields = ["content", "timings/prompt_n", "timings/predicted_n", "tokens_cached", "truncated", "nope/x"]
    async with attached(fim_sim):
        obj = (await request("POST", "/infill", body(response_fields=fields), JSON)).json()
    assert set(obj) == {"content", "timings/prompt_n", "timings/predicted_n", "tokens_cached", "truncated"}
    assert obj["timings/predicted_n"] == 6


@pytestmark_db
async def test_streamed_infill_sends_content_frames_then_a_last_stop_frame_and_no_done(fim_sim: FimSimWorker) -> None:
    async with attached(fim_sim):
        whole = (await request("POST", "/infill", body(), JSON)).json()["content"]
        reply = await request("POST", "/infill", body(stream=True, response_fields=["content", "stop", "timings/predicted_n"]), JSON)
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/event-stream")
    frames = [json.loads(d) for d in reply.sse_data()]  # json.loads: no [DONE]
    *deltas, last = frames
    assert deltas and all(f["stop"] is False and f["content"] for f in deltas)
    assert "".join(f["content"] for f in deltas) == whole
    assert deltas[-1]["tokens_predicted"] == 6 and deltas[0]["tokens_evaluated"] > 0
    assert last == {"content": "", "stop": True, "timings/predicted_n": 6}
    assert not reply.body.rstrip().endswith(b"[DONE]")


@pytestmark_db
async def test_bad_bodies_are_400s_in_the_error_shape_and_the_route_keeps_serving(fim_sim: FimSimWorker) -> None:
    bad = [
        (b"{not json", None),
        (json.dumps({"input_extra": [{"filename": "f"}]}).encode(), "input_extra[0].text"),
        (json.dumps({"input_prefix": 3}).encode(), "input_prefix"),
        (json.dumps({"response_fields": [1]}).encode(), "response_fields"),
        (json.dumps({"input_suffix": "\ud800"}).encode(), "input_suffix"),
    ]
    async with attached(fim_sim):
        for raw, param in bad:
            reply = await request("POST", "/infill", raw, JSON)
            assert reply.status == 400 and reply.is_error_object(), reply.body
            assert reply.json()["error"]["param"] == param
        after = await request("POST", "/infill", body(), JSON)
        chat = await request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2}).encode(), JSON)
    assert after.status == 200 and len(after.json()["content"]) == 6
    assert chat.status == 200


@pytestmark_db
async def test_infill_on_a_model_without_fim_tokens_is_501_not_supported_as_llama_server_answers() -> None:
    """llama-server answers /infill on a model without FIM tokens 501 ``not_supported_error``
    (this was a 400 ``invalid_request_error``, a bad request to a client of llama-server);
    ``suffix`` on /v1/completions stays OpenAI's 400."""
    async with attached(SimWorker()):
        replies = [await request("POST", "/infill", body(**extra), JSON) for extra in ({}, {"stream": True})]
        suffix = await request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "a", "suffix": "b"}).encode(), JSON)
    for reply in replies:
        assert reply.status == 501 and reply.is_error_object(), reply.body
        error = reply.json()["error"]
        assert (error["type"], error["code"], error["param"]) == ("not_supported_error", "fim_unsupported", "input_suffix")
        assert error["message"].startswith("Infill is not supported by this model")  # llama-server's words
    assert suffix.status == 400 and suffix.json()["error"]["type"] == "invalid_request_error"
    assert suffix.json()["error"]["code"] == "fim_unsupported"


# -- the real server ----------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.model
def test_the_real_server_answers_infill_with_fim_unsupported_not_404(shared_server: Any) -> None:
    reply = httpx.post(shared_server.base + "/infill", json={"input_prefix": "def f(", "input_suffix": ")", "n_predict": 4}, timeout=60)
    assert reply.status_code == 501, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "fim_unsupported"
