"""serve --fim-model: a second resident model for fill-in-the-middle, with its own lanes.

The bundled SmolLM2 GGUF serves as both models (the FIM one under ``<name>-fim``). SmolLM2 has no
FIM tokens, so a request with ``suffix`` is answered 400 ``fim_unsupported`` by whichever worker
gets it; which one did shows in each model's request count in the admin's model list."""

from __future__ import annotations

import os
import signal

import httpx
import pytest

from scheduler.engines.models import default_model_path, model_name_for

from .server import RunningServer, openai_client
from .test_models import Run
from .test_models import models_state as models

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MAIN = model_name_for(default_model_path())
FIM = MAIN + "-fim"


def two_model_flags(fim_max_context: int) -> list[str]:
    """The bundled GGUF as a one-lane main model and again as the FIM model."""
    gguf = str(default_model_path())
    return ["--model", gguf, "--max-batch", "1", "--ctx-size", "1024", "--fim-model", gguf, "--fim-max-context", str(fim_max_context)]


@pytest.fixture
def srv(fim_server: RunningServer) -> RunningServer:
    """The session's two-model server (tests/conftest.py); other tests use it too, so these
    count requests as deltas."""
    return fim_server


def test_both_models_are_resident_from_the_start_each_with_its_lanes(srv: RunningServer) -> None:
    state = srv.wait_for(lambda: (s := models(srv)) and all(m["state"] == "loaded" for m in s.values()) and s, timeout_s=120)
    assert set(state) == {MAIN, FIM}
    assert (state[MAIN]["lanes"], state[MAIN]["context_length"], state[MAIN]["fim"]) == (1, 1024, False)
    assert (state[FIM]["lanes"], state[FIM]["context_length"], state[FIM]["fim"]) == (2, 2048, True)
    listed = {m.id for m in openai_client(srv.base).models.list().data}
    assert listed == {MAIN, FIM}


def test_fill_in_the_middle_goes_to_the_fim_model_while_the_main_models_lane_is_busy(srv: RunningServer) -> None:
    srv.wait_for(lambda: all(m["state"] == "loaded" and m["running"] == 0 for m in models(srv).values()), timeout_s=120)
    before = models(srv)
    long = Run(srv, MAIN, long=True)  # holds the main model's one lane
    assert long.first.wait(120)
    r = httpx.post(srv.base + "/v1/completions", timeout=60,
                   json={"model": MAIN, "prompt": "def add(a, b):\n    return ", "suffix": "\n", "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["code"] == "fim_unsupported"  # SmolLM2 has no FIM tokens
    during = models(srv)
    assert long.thread.is_alive(), "the long request ended before the FIM request was answered"
    assert during[FIM]["requests"] == before[FIM]["requests"] + 1
    assert during[MAIN]["requests"] == before[MAIN]["requests"] + 1  # the long one only
    long.join()
    # without suffix a request runs on the model it names
    client = openai_client(srv.base)
    plain = client.completions.create(model=MAIN, prompt="Hello", max_tokens=2)
    assert plain.model == MAIN and plain.usage is not None and plain.usage.completion_tokens >= 1
    assert client.chat.completions.create(model=FIM, messages=[{"role": "user", "content": "Hi"}], max_tokens=2).model == FIM
    after = models(srv)
    assert (after[MAIN]["requests"], after[FIM]["requests"]) == (during[MAIN]["requests"] + 1, during[FIM]["requests"] + 1)


def test_a_crash_of_one_models_worker_leaves_the_other_alone(srv: RunningServer) -> None:
    """SIGKILL of the main model's worker: the FIM model's worker never notices, the main one is
    restarted and serves again. (The last test on this session's two-model server: it kills.)"""
    client = openai_client(srv.base)

    def ask(model: str) -> str:
        out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        return out.choices[0].message.content or ""

    assert ask(MAIN) and ask(FIM)

    def pids() -> dict[str, int]:
        snaps = httpx.get(srv.base + "/v1/internal/state", timeout=5).json()["snapshots"]
        return {m: snap["pid"] for m, snap in snaps.items()}

    srv.wait_for(lambda: len(pids()) == 2, timeout_s=30)
    before, restarts = pids(), {m: s["worker_restarts"] for m, s in models(srv).items()}
    os.kill(before[MAIN], signal.SIGKILL)
    assert ask(FIM)  # the FIM model's worker never noticed
    srv.wait_for(lambda: pids().get(MAIN) not in (None, before[MAIN]), timeout_s=120)
    assert ask(MAIN)
    assert pids()[FIM] == before[FIM]
    state = models(srv)
    assert (state[MAIN]["worker_restarts"] - restarts[MAIN], state[FIM]["worker_restarts"] - restarts[FIM]) == (1, 0)
    assert state[MAIN]["state"] == state[FIM]["state"] == "loaded"
