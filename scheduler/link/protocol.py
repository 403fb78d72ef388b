"""The web <-> worker messages, as newline-delimited JSON over a stream socket.

web -> worker (``op``):
    submit  {id, request, qos, priority, batch_invariant, key, resume_text, resume_tokens}
    cancel  {id}
    config  {class_lanes: {class: lanes}}                 admin's caps over --class-lanes; after connect
worker -> web (``ev``):
    hello     {model, engine, n_lanes, lane_ctx, pid}     once, on connect
    accepted  {id, prompt_tokens}                         the job is queued
    rejected  {id, error}                                 never queued; error is an API error dict
    delta     {id, text, tokens}                          text to send; tokens generated so far
    done      {id, finish_reason, usage, timing}
    error     {id, error}                                 failed after acceptance
    snapshot  {state}                                     lanes, queues, counters; a few per second
``error`` dicts carry {status, message, type, param, code}.
"""

from __future__ import annotations

import json
from typing import Any

MAX_LINE_BYTES = 64 * 1024 * 1024


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"


def decode(line: bytes) -> dict[str, Any]:
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("link message is not an object")
    return message


def error_dict(status: int, message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"status": status, "message": message, "type": type_, "param": param, "code": code}
