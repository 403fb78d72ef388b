"""Fill-in-the-middle and the legacy completions endpoint: what an editor (or an evaluation
harness) sends that combines ``suffix``, ``echo``, ``logprobs`` and llama-server's
``n_predict``. In process: the request parser, the worker's prompt building on the simulated
engine, and the reply builder."""

from __future__ import annotations

import json
from typing import Any

from api.responses import Reply
from api.schemas import parse_completion_request
from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import FakeClock, SimEngine
from scheduler.link.messages import Accepted, Delta, Done, Message, Submit
from scheduler.worker.loop import EngineWorker

PRE, SUF, MID = 250, 251, 252


class ScoringFimSim(SimEngine):
    """The simulated engine with FIM tokens and prompt scoring (as the llama.cpp engine has):
    every scored token gets logprob -1 and itself as its one alternative."""

    vocab_size = 256

    def __init__(self) -> None:
        super().__init__(n_lanes=2, lane_ctx=512, clock=FakeClock())
        self.features = frozenset({"logprobs", "prompt_logprobs"})
        self.scored: list[list[int]] = []

    def fim_tokens(self) -> tuple[int, int, int]:
        return PRE, SUF, MID

    def token_bytes(self, token: int) -> bytes:
        return b"" if token in (PRE, SUF, MID) else bytes([token % 256])  # control tokens: no text

    def score_prompt(self, tokens: list[int], top: int) -> list[tuple[float, list[tuple[int, float]]]]:
        self.scored.append(list(tokens))
        return [(-1.0, [(t, -1.0)][:top]) for t in tokens[1:]]


class FakeConn:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    def queue(self, message: Message) -> None:
        self.sent.append(message)


def _accepted(request: dict[str, Any]) -> tuple[Accepted, ScoringFimSim]:
    engine = ScoringFimSim()
    worker = EngineWorker(engine, SchedulerConfig(max_batch=2, lane_ctx=512), model_name="sim", clock=engine.clock)
    conn = FakeConn()
    worker.handle(conn, Submit(id="j", request=request, qos=1))  # type: ignore[arg-type]
    (accepted,) = [m for m in conn.sent if isinstance(m, Accepted)]
    return accepted, engine


def _parse(body: dict[str, Any]) -> Any:
    return parse_completion_request(json.dumps(body).encode(), models=["m"])


# -- echo + logprobs with suffix ------------------------------------------------------------


def test_echo_with_suffix_scores_the_echoed_prefix_only_not_the_suffix_or_the_fim_markers() -> None:
    """``echo`` puts the prompt (the prefix) before the completion; with ``logprobs`` the prompt's
    entries must be that text's tokens. They were every token of the FIM prompt: the suffix's
    tokens and the middle marker came back as if they were part of the echoed prompt, so the
    tokens no longer spelled the text and every completion token's ``text_offset`` was past its
    place by the suffix's length (and differed from the streamed reply's)."""
    request = {"endpoint": "completions", "prompt": "xy", "suffix": "abc", "echo": True, "logprobs": 1, "max_tokens": 2}
    accepted, _ = _accepted(request)
    entries = accepted.prompt_logprobs or []
    assert [e["token_id"] for e in entries] == [PRE, ord("x"), ord("y")]
    assert b"".join(bytes(e["bytes"]) for e in entries) == b"xy"  # what echo puts in the text
    assert entries[0]["logprob"] is None and [e["logprob"] for e in entries[1:]] == [-1.0, -1.0]


def test_echo_with_suffix_and_a_token_array_prompt_scores_the_prefix_ids() -> None:
    request = {"endpoint": "completions", "prompt": [10, 11, 12], "suffix": "ab", "echo": True, "logprobs": 0, "max_tokens": 2}
    accepted, _ = _accepted(request)
    assert [e["token_id"] for e in accepted.prompt_logprobs or []] == [PRE, 10, 11, 12]
    assert accepted.prompt_tokens == 8  # the whole FIM prompt is still what was prefilled


def test_echo_with_suffix_gives_the_same_text_offsets_streamed_and_not() -> None:
    """The reply's offsets, from the worker's entries: the completion's first token starts where
    the echoed prompt ends, in the body and in the stream alike."""
    request = {"endpoint": "completions", "prompt": "xy", "suffix": "abc", "echo": True, "logprobs": 0, "max_tokens": 2}
    accepted, _ = _accepted(request)
    made = {"token_id": ord("!"), "bytes": list(b"!"), "logprob": -0.5, "top": []}
    whole = Reply("completions", "m", echo="xy", logprobs=True)
    whole.prompt_logprobs = list(accepted.prompt_logprobs or [])
    whole.add(Delta("j", "!", 1, [made]))
    choice = whole.body(Done("j", "length"), None)["choices"][0]
    assert choice["text"] == "xy!"
    assert "".join(choice["logprobs"]["tokens"]) == "xy!"
    streamed = Reply("completions", "m", echo="xy", logprobs=True)
    streamed.prompt_logprobs = list(accepted.prompt_logprobs or [])
    (first,) = streamed.first_chunks()
    (nxt,) = streamed.delta_chunks(Delta("j", "!", 1, [made]))
    offsets = first["choices"][0]["logprobs"]["text_offset"] + nxt["choices"][0]["logprobs"]["text_offset"]
    assert choice["logprobs"]["text_offset"] == offsets
    assert offsets[-1] == len("xy")


def test_echo_without_suffix_still_scores_the_whole_prompt() -> None:
    accepted, engine = _accepted({"endpoint": "completions", "prompt": "xyz", "echo": True, "logprobs": 0, "max_tokens": 2})
    assert [e["token_id"] for e in accepted.prompt_logprobs or []] == [ord("x"), ord("y"), ord("z")]
    assert engine.scored == [[ord("x"), ord("y"), ord("z")]]


# -- n_predict 0 ------------------------------------------------------------------------------


def test_n_predict_zero_is_one_token_as_llama_server_not_the_rest_of_the_context() -> None:
    """llama-server's ``n_predict: 0`` (llama.vim and llama.vscode send it to warm the prompt
    cache) generates nothing on old servers and one token on current ones; it was read as "no
    limit", so such a request generated until the lane's context was full."""
    assert _parse({"model": "m", "prompt": "def f(", "suffix": ")\n", "n_predict": 0}).max_tokens == 1
    assert _parse({"model": "m", "prompt": "x", "n_predict": 0}).max_tokens == 1
    assert _parse({"model": "m", "prompt": "x", "n_predict": -1}).max_tokens is None  # -1: no limit
    assert _parse({"model": "m", "prompt": "x", "n_predict": 7}).max_tokens == 7
    assert _parse({"model": "m", "prompt": "x", "max_tokens": 5, "n_predict": 0}).max_tokens == 5  # max_tokens wins


# -- the MLX engine's FIM markers ------------------------------------------------------------


class _Vocab:
    def __init__(self, names: list[str]) -> None:
        self.ids = {n: 1000 + i for i, n in enumerate(names)}

    def token_to_id(self, name: str) -> int | None:
        return self.ids.get(name)


def _mlx_fim(names: list[str]) -> tuple[int, int, int] | None:
    from scheduler.engines.mlx import MlxEngine

    engine = MlxEngine.__new__(MlxEngine)  # only its vocabulary: no model (MLX is not here)
    engine._tok = _Vocab(names)  # type: ignore[assignment]
    return engine.fim_tokens()


def test_mlx_finds_the_fim_markers_of_deepseek_coder_and_codellama_as_llama_cpp_does() -> None:
    """llama.cpp's vocabulary finds DeepSeek-Coder's and CodeLlama's FIM tokens by their text; the
    MLX engine knew only the ``fim_prefix`` spellings, so ``suffix`` on those models (served
    from MLX folders) was 400 ``fim_unsupported``."""
    deepseek = ["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"]
    assert _mlx_fim(deepseek) == (1000, 1001, 1002)  # begin = prefix, hole = suffix, end = middle
    assert _mlx_fim(["▁<PRE>", "▁<SUF>", "▁<MID>", "▁<EOT>"]) == (1000, 1001, 1002)
    assert _mlx_fim(["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]) == (1000, 1001, 1002)
    assert _mlx_fim(["<|im_start|>", "<|im_end|>"]) is None  # no FIM tokens: still unsupported
