"""QoS scheduling against the real server and model: preemption with parking, prefix sharing,
request priority, batch-invariant and fill-in-the-middle gates."""

from __future__ import annotations

import threading

import httpx
import pytest

from .server import RunningServer, lane_count, stream_text

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"
ONE_LANE = "smol"  # the several-models server's SmolLM2 (tests/conftest.py: models_server): one lane


def agent_body(model: str = MODEL) -> dict:
    return {
        "_path": "/v1/completions",
        "prompt": "Here is a list of fruits and their colours:\n1. Apple - red\n2.",
        "model": model,
        "max_tokens": 60,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_a_preempted_greedy_agent_streams_exactly_what_it_streams_undisturbed(models_server: RunningServer) -> None:
    """On the session's several-models server (tests/conftest.py), whose ``smol`` has one lane: the
    interactive chat goes to that model's worker although its lane is busy, and the worker parks
    the background agent for it. One lane, so every step is a batch of one, as undisturbed."""
    srv = models_server

    def counters() -> dict:
        return srv.state()["snapshots"][ONE_LANE]["counters"]

    # the undisturbed run loads smol if a test before left Gemma (or nothing) in its slot; nothing
    # asks for Gemma here, so the same worker serves the preempted run
    undisturbed, _ = stream_text(srv.base, agent_body(ONE_LANE), {"x-superfluid-qos": "background"})
    chat_done = threading.Event()

    def send_chat(n: int) -> None:
        # the second chunk: the first token went alone, the second chunk carries the tokens of the
        # rounds since (--stream-interval-ms), so the agent has more than 50 tokens to go
        if n == 2 and not chat_done.is_set():
            chat_done.set()
            threading.Thread(
                target=stream_text,
                args=(
                    srv.base,
                    {"_path": "/v1/chat/completions", "model": ONE_LANE, "max_tokens": 8, "stream": True,
                     "messages": [{"role": "user", "content": "Hi!"}]},
                    {"x-superfluid-qos": "interactive"},
                ),
            ).start()

    before = counters()
    preempted, usage = stream_text(srv.base, agent_body(ONE_LANE), {"x-superfluid-qos": "background"}, on_chunk=send_chat)
    after = counters()
    assert after["preemptions"] - before["preemptions"] == 1
    assert after["parks"] - before["parks"] == 1 and after["resumes"] - before["resumes"] == 1
    assert preempted == undisturbed
    assert usage["completion_tokens"] > 10  # the preemption came mid-stream (after 2 chunks, a few tokens)


def test_an_interactive_chat_takes_a_lane_from_background_work_and_finishes_first(server: RunningServer) -> None:
    finished: list[str] = []

    def agent(name: str) -> None:
        body = agent_body() | {"max_tokens": 160}
        stream_text(server.base, body, {"x-superfluid-qos": "background"})
        finished.append(name)

    # background agents on every lane, then an interactive chat
    threads = [threading.Thread(target=agent, args=(f"agent{i}",)) for i in range(lane_count(server))]
    for t in threads:
        t.start()
    server.wait_for(lambda: server.state()["lanes_active"] == len(threads), timeout_s=120)
    before = server.state()["counters"]["preemptions"]
    text, _ = stream_text(
        server.base,
        {"_path": "/v1/chat/completions", "model": MODEL, "max_tokens": 10, "stream": True,
         "messages": [{"role": "user", "content": "Say hello."}]},
        {"x-superfluid-qos": "interactive"},
    )
    finished.append("chat")
    for t in threads:
        t.join(120)
    assert text
    assert finished[0] == "chat"
    assert server.state()["counters"]["preemptions"] > before


def test_requests_sharing_a_long_system_prompt_report_it_as_cached_tokens(server: RunningServer) -> None:
    system = "You are a meticulous assistant for a shipping company. " * 30
    results: dict[int, dict] = {}
    started = threading.Event()

    def ask(i: int, max_tokens: int = 4) -> None:
        body = {"_path": "/v1/chat/completions", "model": MODEL, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"Order {i}?"}]}
        results[i] = stream_text(server.base, body, on_chunk=lambda _n: started.set())[1]

    # the first one is answering (its prompt computed, its lane busy) when three more arrive at
    # once: they take free lanes and copy the prefix from the first's lane (or, when the lanes
    # are taken, wait and are seeded from the cache or a lane); none prefills the shared prompt
    # again
    first = threading.Thread(target=ask, args=(0, 24))
    first.start()
    assert started.wait(180)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(1, 4)]
    for t in threads:
        t.start()
    for t in [first, *threads]:
        t.join(180)
    prompt = results[0]["prompt_tokens"]
    cached = [results[i]["prompt_tokens_details"]["cached_tokens"] for i in range(4)]
    # the first prefilled its prompt (but for a chat template's opening that a kept lane it took
    # may share: fewer than min_prefix_tokens)
    assert cached[0] < 32 and all(c > prompt // 2 for c in cached[1:]), (cached, prompt)


def test_the_priority_header_alone_picks_the_class_of_its_band(server: RunningServer) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    for value, expected in [("interactive", "interactive"), ("100", "interactive"), ("-100", "background"),
                            ("batch", "background"), ("7", "agent"), ("garbage", "agent")]:
        r = httpx.post(server.base + "/v1/completions", json=body, headers={"X-LlamaSwap-Priority": value}, timeout=60)
        assert r.status_code == 200
        assert r.headers["x-superfluid-qos"] == expected, value
    r = httpx.post(server.base + "/v1/completions", json=body,
                   headers={"X-LlamaSwap-Priority": "100", "x-superfluid-qos": "background"}, timeout=60)
    assert r.headers["x-superfluid-qos"] == "background"  # the class header wins


def test_fill_in_the_middle_on_a_model_without_fim_tokens_is_400_fim_unsupported(server: RunningServer) -> None:
    r = httpx.post(server.base + "/v1/completions",
                   json={"model": MODEL, "prompt": "def add(a, b):\n    return ", "suffix": "\n", "max_tokens": 4}, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "fim_unsupported"
    assert r.json()["error"]["param"] == "suffix"
