"""Every message the web side and the engine worker exchange, typed, and their wire form.

web -> worker:  Submit, Cancel, Config
worker -> web:  Hello (once, on connect), Accepted, Delta, Done, Rejected, Error, Snapshot

A message travels as one line of JSON: ``{"type": "<name>", ...fields}``. The same encoding is
used by every transport (in-process, local socket, Redis), so a message that cannot be encoded
fails in the same place everywhere: :func:`encode` raises :class:`EncodeError` *before* anything
is sent or registered, and the caller fails that one job.

The worker answers with *reasons* (``Rejected.reason``, ``Error.reason``: the constants below),
never with HTTP statuses; the web side alone maps a reason to a status and an OpenAI error
object (``api/link_errors.py``).

Adding a field: give it a default in its dataclass (one line). A decoder ignores fields it does
not know and fills the ones a sender left out with their defaults, so the two ends can be a
version apart (a Redis fleet is upgraded one process at a time).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

MAX_LINE_BYTES = 64 * 1024 * 1024


class EncodeError(ValueError):
    """The message cannot be put on the link (a lone surrogate, a value JSON cannot hold...)."""


# -- reasons: why the worker refused or failed a job ------------------------------------------

# Rejected (never queued)
SHUTTING_DOWN = "shutting_down"
DUPLICATE_ID = "duplicate_id"
INVALID_JOB = "invalid_job"  # a Submit the worker cannot make a job of (a bug or a version skew)
EMPTY_PROMPT = "empty_prompt"
INVALID_MESSAGES = "invalid_messages"  # the chat template refused them
INVALID_PROMPT = "invalid_prompt"  # token ids outside the vocabulary
FIM_UNSUPPORTED = "fim_unsupported"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
UNSUPPORTED_PARAMETER = "unsupported_parameter"  # a sampling feature this engine lacks (logit_bias on MLX...)
INVALID_VALUE = "invalid_value"  # a parameter the engine cannot take (a token id outside the vocabulary, a grammar that does not compile)
# Error (failed after acceptance, or never reached a worker)
ENGINE_ERROR = "engine_error"
GRAMMAR_TOO_SLOW = "grammar_too_slow"  # its grammar's masks held every lane up for too long in all
DEADLINE_EXCEEDED = "completion_deadline_exceeded"
SHUTDOWN = "shutdown"  # the server stopped before the job finished
ENGINE_UNAVAILABLE = "engine_unavailable"  # no worker came back in time
ENGINE_CRASHED = "engine_crashed"  # in flight during two worker crashes in a row: not tried again
UNENCODABLE = "unencodable"  # the job's message could not be encoded for the link


@dataclass(frozen=True)
class Message:
    type: ClassVar[str] = ""


@dataclass(frozen=True)
class JobMessage(Message):
    """About one job: ``id`` is the one the web side gave it in its Submit."""

    id: str


# -- web -> worker ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Submit(JobMessage):
    """A job. ``request`` is ``GenerationRequest.to_wire()``; ``resume_*`` are set when a job is
    submitted again after a worker loss (continue after the text already delivered).
    ``waited_ms``: how long the request already waited before it was submitted (at the model
    router, with several models; for the worker to connect, with one); the worker counts its queue wait and time to first token from
    then, and says so in its Done's ``timing["waited_ms"]``. A worker refuses a value that is not
    a number from 0 to a week (``invalid_job``); one that does not know the field ignores it."""

    type: ClassVar[str] = "submit"
    request: dict[str, Any]
    qos: int = 2
    priority: int = 0
    batch_invariant: bool = False
    pin_prefix: bool = False
    cache_scope: str = ""  # prefix-cache partition: "" is the shared scope
    resume_text: str = ""
    resume_tokens: int = 0
    waited_ms: float = 0
    # a later job of one client request (n > 1, several prompts): its first job's id, so the
    # request is dispatched and waits once in llamaswap_scheduler_*; "" for a first or only job
    request_of: str = ""


@dataclass(frozen=True)
class Cancel(JobMessage):
    type: ClassVar[str] = "cancel"


@dataclass(frozen=True)
class Config(Message):
    """Settings the admin can change while serving; sent after every (re)connect, before any job."""

    type: ClassVar[str] = "config"
    class_lanes: dict[str, int] = field(default_factory=dict)


# -- worker -> web ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello(Message):
    type: ClassVar[str] = "hello"
    model: str
    engine: str
    n_lanes: int
    lane_ctx: int
    pid: int
    # optional, for /v1/models' meta and /props: where the engine knows them
    n_ctx_train: int | None = None
    n_vocab: int | None = None
    chat_template: str | None = None  # the template chats are rendered with (/props)
    # llama-server's /v1/models meta (n_embd, n_params, size: the weights' bytes) and /props'
    # model_ftype ("Q4_1", ...), where the engine knows them
    n_embd: int | None = None
    n_params: int | None = None
    model_size: int | None = None
    model_ftype: str | None = None
    # how the model writes tool calls in tool_choice auto (scheduler.engines.chat.TOOL_FORMATS)
    tool_format: str = "hermes"
    # how the model writes its reasoning (scheduler.engines.chat.REASONING_FORMATS): the web
    # side sends it as reasoning_content
    reasoning_format: str = "none"


@dataclass(frozen=True)
class Accepted(JobMessage):
    type: ClassVar[str] = "accepted"
    prompt_tokens: int = 0
    # completions echo + logprobs: one entry per prompt token (the first one's logprob null)
    prompt_logprobs: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Delta(JobMessage):
    """Text to send; ``tokens``: the completion tokens whose text went out so far (resumed ones
    included; a token whose text the worker still holds, a possible stop string's start or a
    character's first bytes, counts once it goes: a job submitted again goes on after them);
    ``logprobs``: one entry per token of the text in this delta (``token_id``, ``bytes``,
    ``logprob``, ``top``), only when the request asked for logprobs; ``preemptions``: how many
    times this worker has preempted the job so far (the web side adds a lost worker's last count
    to the Done's ``timing["preemptions"]`` of the worker the job was submitted to again)."""

    type: ClassVar[str] = "delta"
    text: str
    tokens: int = 0
    logprobs: list[dict[str, Any]] | None = None
    preemptions: int = 0


@dataclass(frozen=True)
class Done(JobMessage):
    type: ClassVar[str] = "done"
    finish_reason: str
    usage: dict[str, int] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)
    serial: dict[str, Any] = field(default_factory=dict)
    embeddings: list[list[float]] | None = None  # /v1/embeddings: one vector per input
    stop_word: str | None = None  # the stop string that ended the text, if one did (/infill's stopping_word)


# A job refused or failed: ``reason`` is one of the constants above.


@dataclass(frozen=True)
class Rejected(JobMessage):
    """Never queued. ``detail`` is a sentence for the client; ``param`` the request field it is about."""

    type: ClassVar[str] = "rejected"
    reason: str
    detail: str = ""
    param: str | None = None


@dataclass(frozen=True)
class Error(JobMessage):
    """Failed after acceptance (or, made by the web side, never reached a worker)."""

    type: ClassVar[str] = "error"
    reason: str
    detail: str = ""


@dataclass(frozen=True)
class Snapshot(Message):
    """Lanes, queues, counters and metrics; a few per second."""

    type: ClassVar[str] = "snapshot"
    state: dict[str, Any] = field(default_factory=dict)


MESSAGES: dict[str, type[Message]] = {
    cls.type: cls for cls in (Submit, Cancel, Config, Hello, Accepted, Rejected, Delta, Done, Error, Snapshot)
}
# each message class's field names, looked up once: a Delta per token is encoded and decoded
_FIELDS: dict[type[Message], tuple[str, ...]] = {cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in MESSAGES.values()}
JobEvent = Accepted | Rejected | Delta | Done | Error  # what a job's handle yields


def encode(message: Message) -> bytes:
    """One line of JSON. Strict: every string must be encodable UTF-8 (no lone surrogates), every
    number finite, the line at most MAX_LINE_BYTES (the reader's bound: a longer line would end
    the connection, every job on it with it); otherwise :class:`EncodeError` and nothing is sent."""
    names = _FIELDS.get(type(message)) or tuple(f.name for f in dataclasses.fields(message))
    body = {"type": message.type, **{name: getattr(message, name) for name in names}}
    try:
        line = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n"
    except (UnicodeEncodeError, ValueError, TypeError, RecursionError) as exc:
        raise EncodeError(f"{message.type} message cannot be encoded: {exc}") from None
    if len(line) > MAX_LINE_BYTES:
        raise EncodeError(f"{message.type} message is {len(line):,} bytes; the link carries at most {MAX_LINE_BYTES:,}")
    return line


def decode(line: bytes) -> Message:
    """The message on one line; ``ValueError`` if it is not one (the caller drops the line)."""
    try:
        body = json.loads(line)
    except RecursionError:  # nested too deep for the parser: as malformed as any other line
        raise ValueError("link message is nested too deeply") from None
    if not isinstance(body, dict):
        raise ValueError("link message is not an object")
    cls = MESSAGES.get(str(body.get("type")))
    if cls is None:
        raise ValueError(f"unknown link message type {body.get('type')!r}")
    if issubclass(cls, JobMessage) and not isinstance(body.get("id", ""), str):
        # a job id no web side or worker sends (a list, an object): a reader's look-up of it
        # raised, which ended the worker (every job on it) or the web side's link
        raise ValueError(f"{cls.type} message with a job id that is not a string")
    try:
        return cls(**{k: body[k] for k in _FIELDS[cls] if k in body})
    except TypeError as exc:  # a required field missing
        raise ValueError(f"malformed {cls.type} message: {exc}") from None


def decode_or_drop(line: bytes, sender: str) -> Message | None:
    """The message on one line ``sender`` wrote, or None (logged) if it is not one."""
    try:
        return decode(line)
    except ValueError as exc:
        logging.getLogger("superfluid.link").warning("dropping a malformed message from %s: %s", sender, exc)
        return None
