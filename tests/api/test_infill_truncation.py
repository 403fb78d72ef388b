"""``POST /infill`` with a prefix or suffix longer than the context: llama-server's format_infill
cuts them (the prefix's tail and the suffix's head are kept, about 3:1) instead of refusing, so an
editor plugin sending a large file around the cursor still gets a completion."""

from __future__ import annotations

import json

import pytest

from scheduler.core.scheduler import SchedulerConfig
from scheduler.link.messages import Accepted, Submit
from scheduler.worker.loop import EngineWorker
from tests.api.test_infill import MID, MODEL, PRE, SUF, FakeConn, FimSim, FimSimWorker, b, parse, prompt_of
from tests.edge.inproc import JSON, attached, request


def test_a_prefix_longer_than_the_context_keeps_its_tail_and_fits() -> None:
    prefix = "".join(chr(ord("a") + i % 26) for i in range(2000))
    tokens, fim = prompt_of({"input_prefix": prefix, "input_suffix": "z", "n_predict": 16})
    assert len(tokens) + 16 <= fim.lane_ctx
    assert tokens[0] == PRE and tokens[-3:] == [SUF, *b("z"), MID]
    kept = tokens[1:-3]
    assert kept and kept == b(prefix)[-len(kept) :]


def test_a_suffix_longer_than_the_context_keeps_its_head_and_the_prefix_most_of_the_room() -> None:
    tokens, fim = prompt_of({"input_prefix": "P" * 2000, "input_suffix": "S" * 2000, "n_predict": 16})
    assert len(tokens) + 16 <= fim.lane_ctx
    suf = tokens.index(SUF)
    assert tokens[0] == PRE and tokens[-1] == MID
    n_prefix, n_suffix = suf - 1, len(tokens) - suf - 2
    assert tokens[1:suf] == b("P" * n_prefix) and tokens[suf + 1 : -1] == b("S" * n_suffix)
    assert n_suffix > 0 and n_prefix >= 2 * n_suffix


def test_a_long_infill_is_accepted_not_refused_as_too_long() -> None:
    req, _ = parse({"input_prefix": "x" * 3000, "input_suffix": "y" * 3000, "n_predict": 8})
    fim = FimSim(n_lanes=2)
    worker = EngineWorker(fim, SchedulerConfig(max_batch=2, lane_ctx=fim.lane_ctx), model_name=MODEL, clock=fim.clock)
    conn = FakeConn()
    worker.handle(conn, Submit(id="j", request=req.to_wire(), qos=1))  # type: ignore[arg-type]
    refusals = [m for m in conn.sent if getattr(m, "reason", None)]
    assert not refusals, refusals
    assert any(isinstance(m, Accepted) for m in conn.sent)


def test_a_short_infill_is_not_cut() -> None:
    tokens, _ = prompt_of({"input_prefix": "P" * 300, "input_suffix": "S" * 100, "n_predict": 16})
    assert tokens == [PRE, *b("P" * 300), SUF, *b("S" * 100), MID]


def test_without_n_predict_the_extra_context_leaves_room_to_complete() -> None:
    """llama-server's n_extra_take (n_ctx - n_batch - 2*n_predict) leaves the completion room when
    n_predict is not given; extra chunks filling the context to its last token left one."""
    body = {"input_prefix": "P" * 20, "input_suffix": "S" * 20, "input_extra": [{"filename": "f", "text": "x" * 5000}]}
    tokens, fim = prompt_of(body, sep=True)
    assert fim.lane_ctx - len(tokens) >= fim.lane_ctx // 8


def test_without_n_predict_a_long_prefix_leaves_room_to_complete() -> None:
    tokens, fim = prompt_of({"input_prefix": "P" * 5000, "input_suffix": "S" * 5000})
    assert fim.lane_ctx - len(tokens) >= fim.lane_ctx // 8


@pytest.mark.django_db(transaction=True)
async def test_the_route_completes_a_file_longer_than_the_context() -> None:
    worker = FimSimWorker()
    body = {"input_prefix": "def f():\n" * 400, "input_suffix": "    return 1\n" * 300, "n_predict": 6}
    async with attached(worker):
        reply = await request("POST", "/infill", json.dumps(body).encode(), JSON)
    assert reply.status == 200, reply.body
    obj = reply.json()
    assert obj["tokens_predicted"] == 6 and 0 < obj["tokens_evaluated"] <= worker.lane_ctx - 6
