"""A reasoning model's reply split into its reasoning and its answer, as llama-server's default
``--reasoning-format auto`` splits it (common/chat.cpp, common/parsers/gpt-oss.cpp): the
reasoning goes out as ``reasoning_content`` (streamed as ``delta.reasoning_content``), the
answer as ``content``.

The model's format comes from its chat template (``scheduler.engines.chat.reasoning_format``,
in its worker's Hello):

* ``think`` / ``think-open``: ``<think>...</think>`` before the answer (Qwen 3, QwQ, DeepSeek R1
  and its distills). ``think-open``: the template opens the block itself in the generation
  prompt (DeepSeek R1's ``<think>\\n``), so the reply starts inside it; it is reasoning up to
  ``</think>``, all of it if that never comes. ``think``: only a reply that begins with
  ``<think>`` holds reasoning; any other is all answer.
* ``mistral``: the same with ``[THINK]...[/THINK]`` (Magistral's, Ministral 3 Reasoning's: control
  tokens the worker writes as text, as llama-server keeps them, its ``preserved_tokens``); only
  a reply that begins with ``[THINK]`` holds reasoning, as ``think``.
* ``harmony``: gpt-oss's channels. llama.cpp renders ``<|channel|>``, ``<|message|>``,
  ``<|start|>`` and ``<|constrain|>`` as text, and ``<|end|>`` too (its vocabulary's, where
  ``<|return|>`` and ``<|call|>`` are there: the MLX engine as well), so a reply reads
  ``<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>Hello``: the
  analysis channel is reasoning, the final channel (and a commentary preamble) the answer, and
  a commentary message to ``functions.NAME`` a tool call. The call is handed on as the generic
  ``<tool_call>{"name": NAME, "arguments": ...}</tool_call>`` block, whose streaming and parsing
  ``api.responses.Reply`` has; a call of a function the request does not offer (none, or a
  built-in tool's) is dropped, as llama-server drops calls nobody asked for. As llama-server
  reads gpt-oss's calls only from a recipient's header, a message's text is no call's: it is
  answer kept as written (:class:`Kept`), so a ``<tool_call>`` block (or a tool format's own
  tags) written in a final or preamble message is its text. A reply that opens no message
  (no header at its start: a forced call's grammar writes the generic block from the first
  token, as does the grammar of tools beside a response_format) is answer read as any reply's.
* ``harmony-unsplit``: gpt-oss's reply where it is not split (reasoning_format ``none``, a
  prefill's continuation), tools offered or not: its calls of offered functions are read all
  the same, as llama-server's gpt-oss parser reads them with reasoning_format none, and the rest
  is answer as that parser gives it (common/parsers/gpt-oss.cpp): an analysis message as
  written, its ``<|channel|>analysis<|message|>`` and ``<|end|>`` kept, a final or preamble
  message's text without its header, no ``<|start|>assistant`` between them. A reply that
  continues a prefill begins inside the prefill's message: its text up to the first marker is
  answer as written, with the ``<|end|>`` that ends it. No call is read in any of that text
  (:class:`Kept`): the analysis is the model's reasoning, and calls come from recipients only.

Each splitter takes the reply in pieces as they come (``feed``) and says what of it is reasoning
and what answer; ``finish`` gives the rest. Any split of the reply gives the same reasoning and
answer, and each piece is looked at once (text that may be a marker's start is held, a bounded
amount): streaming stays linear in the reply's length. The reasoning is stripped at both ends,
as llama-server strips it: its leading whitespace is dropped, its trailing held until more
reasoning follows."""

from __future__ import annotations

import json
import re
from collections.abc import Collection

from scheduler.engines.chat import REASONING_BLOCKS

THINK_OPEN, THINK_CLOSE = REASONING_BLOCKS["think"]
MISTRAL_THINK_OPEN, MISTRAL_THINK_CLOSE = REASONING_BLOCKS["mistral"]

# gpt-oss's markers that llama.cpp renders as text
H_CHANNEL, H_MESSAGE, H_START, H_CONSTRAIN, H_END = "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<|end|>"
# where a message's text ends: the next message's start, an end kept as text, or a channel opened
# without a start (gpt-oss-20b writes one at times)
_H_BODY_ENDS = (H_START, H_END, H_CHANNEL)
# the most a message's header takes (``<|start|>assistant to=functions.NAME<|channel|>commentary
# <|constrain|>json``): past it, the text is no header and is answer
MAX_HEADER = 512
_PIECE = 256  # the most of a reply one step of HarmonySplitter takes
_H_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([A-Za-z0-9_]+)")
_H_RECIPIENT = re.compile(r"(?:^|\s)to=([^\s<]+)")
# gpt-oss's reply not split: its calls read, the rest answer (module docstring)
HARMONY_UNSPLIT = "harmony-unsplit"


class Kept(str):
    """Answer text in which no tool call is read: a harmony message's text (gpt-oss's calls come
    only from a recipient's header, as llama-server reads them), and a ``harmony-unsplit``
    analysis message kept as written, its markers too."""


# a splitter's answer in order: each piece's text and whether it is kept as written (:class:`Kept`)
Parts = list[tuple[str, bool]]


def _parts(pieces: list[str]) -> Parts:
    """``pieces`` of answer as :data:`Parts`, neighbours of a kind joined, none empty."""
    out: Parts = []
    run: list[str] = []
    kept = False
    for piece in pieces:
        if not piece:
            continue
        if isinstance(piece, Kept) != kept and run:
            out.append(("".join(run), kept))
            run = []
        kept = isinstance(piece, Kept)
        run.append(piece)
    if run:
        out.append(("".join(run), kept))
    return out


def partial_suffix(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest end of ``text`` that is a proper start of one of ``markers``
    (text a stream holds back: a marker may still be coming)."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


class Splitter:
    """Base: the reasoning's stripping. ``feed``/``finish`` return (reasoning, answer)."""

    def __init__(self) -> None:
        self.reasoning_begun = False  # reasoning other than whitespace went out
        self.reasoning_space: list[str] = []  # trailing whitespace of the reasoning, held

    def _reason(self, piece: str) -> str:
        """``piece`` of reasoning as it goes out: none of its leading whitespace, its trailing
        held until more reasoning follows (and dropped at the end)."""
        if not piece:
            return ""
        if not self.reasoning_begun:
            piece = piece.lstrip()
            if not piece:
                return ""
        body = piece.rstrip()
        if not body:
            self.reasoning_space.append(piece)
            return ""
        out = "".join(self.reasoning_space) + body
        self.reasoning_space = [piece[len(body) :]]
        self.reasoning_begun = True
        return out

    def feed(self, text: str) -> tuple[str, str]:
        raise NotImplementedError

    def finish(self, *, cut: bool = False) -> tuple[str, str]:
        """The rest; ``cut``: the reply was cut short (max_tokens), not ended by the model."""
        raise NotImplementedError

    def feed_parts(self, text: str) -> tuple[str, Parts]:
        """:meth:`feed`, the answer in :data:`Parts` (none of it kept as written here)."""
        reasoning, answer = self.feed(text)
        return reasoning, _parts([answer])

    def finish_parts(self, *, cut: bool = False) -> tuple[str, Parts]:
        """:meth:`finish`, the answer in :data:`Parts`."""
        reasoning, answer = self.finish(cut=cut)
        return reasoning, _parts([answer])


class ThinkSplitter(Splitter):
    """``<think>...</think>`` (or ``opening``...``closing``) then the answer (the answer's leading
    whitespace dropped, as llama-server's parser consumes the spaces after ``</think>``)."""

    def __init__(self, *, forced_open: bool = False, opening: str = THINK_OPEN, closing: str = THINK_CLOSE) -> None:
        super().__init__()
        self.opening, self.closing = opening, closing
        # "start": the reply's start (whitespace, maybe "<think>" coming); "think"; "answer"
        self.state = "start"
        self.forced_open = forced_open
        self.pending = ""  # held: a start that may be "<think>", or a possible "</think>"'s start
        self.after_close = False  # the answer's leading whitespace is still to drop

    def feed(self, text: str) -> tuple[str, str]:
        reasoning: list[str] = []
        answer: list[str] = []
        self._feed(text, reasoning, answer)
        return "".join(reasoning), "".join(answer)

    def _answer(self, piece: str, out: list[str]) -> None:
        if self.after_close:
            piece = piece.lstrip()
            if not piece:
                return
            self.after_close = False
        out.append(piece)

    def _feed(self, text: str, reasoning: list[str], answer: list[str]) -> None:
        if self.state == "answer":
            self._answer(text, answer)
            return
        text, self.pending = self.pending + text, ""
        if self.state == "start":
            body = text.lstrip()
            if body.startswith(self.opening):
                self.state, text = "think", body[len(self.opening) :]
            elif self.opening.startswith(body) and len(text) <= MAX_HEADER:  # whitespace, or "<think>" coming
                self.pending = text
                return
            elif self.forced_open:
                self.state = "think"
            else:
                self.state = "answer"
                answer.append(text)
                return
        # in the reasoning
        at = text.find(self.closing)
        if at >= 0:
            reasoning.append(self._reason(text[:at]))
            self.state, self.after_close = "answer", True
            self._answer(text[at + len(self.closing) :], answer)
            return
        keep = partial_suffix(text, (self.closing,))
        self.pending = text[len(text) - keep :] if keep else ""
        reasoning.append(self._reason(text[: len(text) - keep]))

    def finish(self, *, cut: bool = False) -> tuple[str, str]:
        pending, self.pending = self.pending, ""
        if self.state == "start":  # whitespace alone, or a "<think>" cut short
            if self.forced_open:
                return self._reason(pending), ""
            return "", pending
        if self.state == "think":  # never closed: all of it reasoning
            return self._reason(pending), ""
        return "", ""


class HarmonySplitter(Splitter):
    """gpt-oss's channels (module docstring). ``calls``: the functions the request offers, whose
    calls are handed on as ``<tool_call>`` blocks (any other call is dropped). ``unsplit``: the
    analysis is answer as written (``harmony-unsplit``); ``continues``: the reply continues a
    prefill, so begins inside a message's text (kept as written, ``unsplit`` only)."""

    def __init__(self, *, calls: Collection[str] = (), unsplit: bool = False, continues: bool = False) -> None:
        super().__init__()
        self.calls = frozenset(calls)
        self.unsplit = unsplit
        # "head": a message's header, up to <|message|>; "body": its text; "raw": text that is
        # no header after all: all answer (from the reply's start, no harmony reply: a forced
        # call's grammar writes the generic block there, read as any reply's; after a message,
        # kept, no call read in it)
        self.state = "head"
        self.first = True  # no message opened yet: the header must look like one from its start
        self.header = ""
        # the body's: "reasoning", "answer", "call", "drop", "kept" (unsplit: the text and the
        # <|end|> that ends it are answer as written)
        self.sink = "answer"
        if unsplit and continues:
            self.state, self.first, self.sink = "body", False, "kept"
        self.pending = ""  # body: a possible marker's start
        self.call_open = False  # a call's block is open (its closing goes out at its body's end)
        # a call's head, held until its arguments begin: a reply cut before them has no call
        self.call_head = ""

    def feed(self, text: str) -> tuple[str, str]:
        reasoning, parts = self.feed_parts(text)
        return reasoning, "".join(piece for piece, _kept in parts)

    def feed_parts(self, text: str) -> tuple[str, Parts]:
        reasoning: list[str] = []
        answer: list[str] = []
        # in pieces of a bounded length (any split gives the same): each step copies what is left
        # of its piece, so a whole reply of many messages costs its length, not that times theirs
        for at in range(0, len(text), _PIECE):
            piece = text[at : at + _PIECE]
            while piece:
                piece = self._step(piece, reasoning, answer)
        return "".join(reasoning), _parts(answer)

    def _looks_like_header(self, head: str) -> bool:
        body = head.lstrip(" ")
        if not body:
            return True
        for opening in (H_CHANNEL, H_START, " to=", "to="):
            if body.startswith(opening) or opening.startswith(body):
                return True
        return False

    def _step(self, text: str, reasoning: list[str], answer: list[str]) -> str:
        """Takes what it can of ``text``; returns the rest (to take in the next step)."""
        if self.state == "raw":
            answer.append(text if self.first else Kept(text))
            return ""
        if self.state == "head":
            start = max(0, len(self.header) - len(H_MESSAGE) + 1)
            self.header += text
            if self.first and not self._looks_like_header(self.header[: len(H_CHANNEL) + 1]):
                self.state = "raw"
                answer.append(self.header)
                self.header = ""
                return ""
            at = self.header.find(H_MESSAGE, start, MAX_HEADER + len(H_MESSAGE))
            if at < 0:
                # (once the whole window is here: a <|message|> may end in its last characters)
                if len(self.header) >= MAX_HEADER + len(H_MESSAGE):  # no header after all: the text is answer
                    self.state = "raw"
                    answer.append(self.header if self.first else Kept(self.header))
                    self.header = ""
                return ""
            head, rest = self.header[:at], self.header[at + len(H_MESSAGE) :]
            self.header, self.first = "", False
            self._open(head, answer)
            self.state = "body"
            return rest
        # body
        text, self.pending = self.pending + text, ""
        ends = [(text.find(m), m) for m in _H_BODY_ENDS]
        found = [(at, m) for at, m in ends if at >= 0]
        if found:
            at, marker = min(found)
            self._body(text[:at], reasoning, answer)
            if self.sink == "kept" and marker == H_END:
                answer.append(Kept(H_END))
            self._close(answer)
            self.state = "head"
            # a channel opened without a start begins the next header; the others end this one
            return text[at:] if marker == H_CHANNEL else text[at + len(marker) :] or ""
        keep = partial_suffix(text, _H_BODY_ENDS)
        self.pending = text[len(text) - keep :] if keep else ""
        self._body(text[: len(text) - keep], reasoning, answer)
        return ""

    def _open(self, head: str, answer: list[str]) -> None:
        channels = _H_CHANNEL_NAME.findall(head)
        channel = channels[-1] if channels else ""
        recipients = [r for r in _H_RECIPIENT.findall(head) if r != "assistant"]
        if recipients:
            recipient = recipients[-1]
            name = recipient[len("functions.") :] if recipient.startswith("functions.") else ""
            if name in self.calls:
                self.sink, self.call_open = "call", True
                self.call_head = '<tool_call>{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '
            else:  # a built-in tool's call (browser, python), or a call nobody offered tools for
                self.sink = "drop"
        elif channel == "analysis" and self.unsplit:  # as written, from its channel on
            self.sink = "kept"
            answer.append(Kept(head[head.find(H_CHANNEL) :] + H_MESSAGE))
        elif channel == "analysis":
            self.sink = "reasoning"
        else:  # final, a commentary preamble, or a channel not known: the answer
            self.sink = "answer"

    def _body(self, piece: str, reasoning: list[str], answer: list[str]) -> None:
        if not piece:
            return
        if self.sink == "reasoning":
            reasoning.append(self._reason(piece))
        elif self.sink == "call" and self.call_head:
            if piece.strip():  # (the whitespace before the arguments is no part of them)
                answer.append(self.call_head + piece.lstrip())
                self.call_head = ""
        elif self.sink in ("answer", "kept"):  # a message's text: no call's (module docstring)
            answer.append(Kept(piece))
        elif self.sink == "call":
            answer.append(piece)

    def _close(self, answer: list[str], *, cut: bool = False) -> None:
        """A message's end: a call's block closed. A call cut short (max_tokens) stays open, its
        arguments as far as they came, read as any call so cut (``api.responses.parse_tool_calls``): a
        closing added after them made markup of a call whose arguments are no JSON."""
        if self.call_open and not cut:
            answer.append(self.call_head + "}</tool_call>")
        self.call_open, self.call_head = False, ""

    def finish(self, *, cut: bool = False) -> tuple[str, str]:
        reasoning, parts = self.finish_parts(cut=cut)
        return reasoning, "".join(piece for piece, _kept in parts)

    def finish_parts(self, *, cut: bool = False) -> tuple[str, Parts]:
        reasoning: list[str] = []
        answer: list[str] = []
        if self.state == "head" and self.header:
            if self.first:  # a reply that is only a header's start: as it came
                answer.append(self.header)
            self.header = ""
        elif self.state == "body":
            pending, self.pending = self.pending, ""
            if not (cut and self.sink == "call"):  # (a cut call's: a marker's start, no argument)
                self._body(pending, reasoning, answer)
            self._close(answer, cut=cut)
        return "".join(reasoning), _parts(answer)


def new_splitter(fmt: str, *, calls: Collection[str] = (), continues: bool = False) -> Splitter | None:
    """The splitter for a model whose replies are in ``fmt`` (``scheduler.engines.chat.REASONING_FORMATS``,
    or ``HARMONY_UNSPLIT``); None for "none" (or a format this server does not know). ``calls``:
    the functions offered; ``continues``: the reply continues a prefill."""
    if fmt == "harmony":
        return HarmonySplitter(calls=calls)
    if fmt == HARMONY_UNSPLIT:
        return HarmonySplitter(calls=calls, unsplit=True, continues=continues)
    if fmt in ("think", "think-open"):
        return ThinkSplitter(forced_open=fmt == "think-open")
    if fmt == "mistral":
        return ThinkSplitter(opening=MISTRAL_THINK_OPEN, closing=MISTRAL_THINK_CLOSE)
    return None


def split_parts(splitter: Splitter, text: str, *, cut: bool = False) -> tuple[str, Parts]:
    """(reasoning, answer in :data:`Parts`) of a whole reply, by a ``splitter`` that has seen
    none of it (``cut``: cut short by max_tokens)."""
    r1, a1 = splitter.feed_parts(text)
    r2, a2 = splitter.finish_parts(cut=cut)
    return r1 + r2, _parts([Kept(piece) if kept else piece for piece, kept in a1 + a2])


def split_whole(splitter: Splitter, text: str, *, cut: bool = False) -> tuple[str, str]:
    """(reasoning, answer) of a whole reply, by a ``splitter`` that has seen none of it
    (``cut``: cut short by max_tokens)."""
    reasoning, parts = split_parts(splitter, text, cut=cut)
    return reasoning, "".join(piece for piece, _kept in parts)


def split_reasoning(text: str, fmt: str, *, calls: Collection[str] = ()) -> tuple[str, str]:
    """(reasoning, answer) of a whole reply in ``fmt``."""
    splitter = new_splitter(fmt, calls=calls)
    return ("", text) if splitter is None else split_whole(splitter, text)
