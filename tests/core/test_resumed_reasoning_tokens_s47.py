"""A gpt-oss reply that goes on on another worker (its first one lost): the reply so far holds
gpt-oss's control tokens as text (llama.cpp writes ``<|channel|>``, ``<|message|>``, ``<|start|>``
and ``<|constrain|>`` out), and they are its tokens again in the resumed prompt. They were
tokenised as plain text, so the model went on after ``<``, ``|``, ``channel``... where it had
sampled one token, and its reply lost its channels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scheduler.core.scheduler import SchedulerConfig
from scheduler.engines.sim import SimEngine
from scheduler.worker.loop import EngineWorker

TEMPLATE = (Path(__file__).parent.parent / "api" / "templates_s46" / "gpt-oss-120b.jinja").read_text()
MARKERS = {"<|channel|>": 256, "<|message|>": 257, "<|start|>": 258, "<|constrain|>": 259}


class OssEngine(SimEngine):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.chat_template = TEMPLATE
        self.features = frozenset({"template_vars"})
        self.vocab_size = 260

    def tokenize(self, text: str, *, add_special: bool = True, special: bool = True, after: int | None = None) -> list[int]:
        if special and text in MARKERS:
            return [MARKERS[text]]
        return list(text.encode())

    def token_bytes(self, token: int) -> bytes:
        return next((m.encode() for m, t in MARKERS.items() if t == token), b"") if token >= 256 else bytes([token])


def test_a_resumed_gpt_oss_reply_keeps_its_control_tokens() -> None:
    worker = EngineWorker(OssEngine(n_lanes=1, lane_ctx=512), SchedulerConfig(max_batch=1, lane_ctx=512), model_name="oss")
    assert worker.reasoning_format == "harmony"
    so_far = "<|channel|>analysis<|message|>hm <|x|><|start|>assistant<|channel|>final<|message|>Hi"
    tokens, own = worker._chat_tokens([{"role": "user", "content": "hi"}], so_far)
    assert tokens[own:] == [256, *b"analysis", 257, *b"hm <|x|>", 258, *b"assistant", 256, *b"final", 257, *b"Hi"]
    # another model's reply: such text is what the model wrote as text
    worker = EngineWorker(SimEngine(n_lanes=1, lane_ctx=512), SchedulerConfig(max_batch=1, lane_ctx=512), model_name="sim")
    tokens, own = worker._chat_tokens([{"role": "user", "content": "hi"}], "<|channel|>x")
    assert tokens[own:] == list(b"<|channel|>x")


class MistralEngine(SimEngine):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.chat_template = (Path(__file__).parent.parent / "api" / "templates_s46" / "mistral-nemo-instruct-2407.jinja").read_text()
        self.features = frozenset({"template_vars"})
        self.vocab_size = 257

    def tokenize(self, text: str, *, add_special: bool = True, special: bool = True, after: int | None = None) -> list[int]:
        return [256] if special and text == "[TOOL_CALLS]" else list(text.encode())

    def token_bytes(self, token: int) -> bytes:
        return b"" if token == 256 else bytes([token])


def test_a_resumed_reply_that_offers_tools_keeps_its_formats_control_token() -> None:
    worker = EngineWorker(MistralEngine(n_lanes=1, lane_ctx=512), SchedulerConfig(max_batch=1, lane_ctx=512), model_name="m")
    assert worker.tool_format == "mistral"
    so_far = 'Let me look.[TOOL_CALLS][{"name": "f"'
    tokens, own = worker._chat_tokens([{"role": "user", "content": "hi"}], so_far, offers_tools=True)
    assert tokens[own:] == [*b"Let me look.", 256, *b'[{"name": "f"']
    # a reply that offers no tools holds no such token: the text is what the model wrote
    tokens, own = worker._chat_tokens([{"role": "user", "content": "hi"}], so_far)
    assert tokens[own:] == list(so_far.encode())
