"""serve --fim-model: a model for fill-in-the-middle with its own lanes, resident beside the others.

On the session's several-models server (tests/conftest.py: ``models_server``): the bundled
SmolLM2 GGUF is both ``smol`` (one lane, swapped with Gemma) and the FIM model (under its file
name, two lanes, pinned). SmolLM2 has no FIM tokens, so a request with ``suffix`` is answered 400
``fim_unsupported`` by whichever worker gets it; which one did shows in each model's request
count in the admin's model list."""

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

MAIN = "smol"  # the main model here: one lane of 1024 tokens, loaded on demand
FIM = model_name_for(default_model_path())  # with_fim_model's id: the file name, which no configured id or alias has


@pytest.fixture
def srv(models_server: RunningServer) -> RunningServer:
    """The session's several-models server (tests/conftest.py); other tests use it too, so these
    count requests as deltas, and ask for ``smol`` where they need it loaded (a test before them
    may have swapped it out for Gemma)."""
    return models_server


def ask_for(srv: RunningServer, model: str) -> None:
    """One short request for ``model``: loaded (a swap, if another held the slot) when it returns."""
    r = httpx.post(srv.base + "/v1/completions", json={"model": model, "prompt": "Hi", "max_tokens": 1}, timeout=300)
    assert r.status_code == 200, r.text


def test_the_fim_model_is_resident_beside_the_swapped_models_each_with_its_lanes(srv: RunningServer) -> None:
    # resident without a request for it (loaded at start), and through a swap each way: Gemma and
    # smol take turns in the one slot, the FIM model stays (Gemma's state is left unread: its TTL)
    srv.wait_for(lambda: models(srv)[FIM]["state"] == "loaded", timeout_s=120)
    ask_for(srv, "gemma")
    state = models(srv)
    assert (state[MAIN]["state"], state[FIM]["state"]) == ("unloaded", "loaded"), state
    ask_for(srv, MAIN)
    state = models(srv)
    assert (state[MAIN]["state"], state["gemma"]["state"], state[FIM]["state"]) == ("loaded", "unloaded", "loaded"), state
    assert set(state) == {MAIN, "gemma", FIM}
    assert (state[MAIN]["lanes"], state[MAIN]["context_length"], state[MAIN]["fim"]) == (1, 1024, False)
    assert (state[FIM]["lanes"], state[FIM]["context_length"], state[FIM]["fim"]) == (2, 2048, True)
    listed = {m.id for m in openai_client(srv.base).models.list().data}
    assert listed == {MAIN, "small", "gemma", "g3", FIM}


def test_fill_in_the_middle_goes_to_the_fim_model_while_the_main_models_lane_is_busy(srv: RunningServer) -> None:
    srv.wait_for(lambda: all(m["running"] == 0 for m in models(srv).values()) and models(srv)[FIM]["state"] == "loaded", timeout_s=120)
    before = models(srv)
    long = Run(srv, MAIN, long=True)  # holds the main model's one lane (loaded for it, if Gemma was)
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
    restarted and serves again (so the tests after this one on the shared server find it serving)."""
    client = openai_client(srv.base)

    def ask(model: str) -> str:
        out = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        return out.choices[0].message.content or ""

    assert ask(MAIN) and ask(FIM)

    def pids() -> dict[str, int]:
        snaps = httpx.get(srv.base + "/v1/internal/state", timeout=5).json()["snapshots"]
        return {m: snap["pid"] for m, snap in snaps.items()}

    srv.wait_for(lambda: MAIN in pids() and FIM in pids(), timeout_s=30)
    before, restarts = pids(), {m: s["worker_restarts"] for m, s in models(srv).items()}
    os.kill(before[MAIN], signal.SIGKILL)
    assert ask(FIM)  # the FIM model's worker never noticed
    srv.wait_for(lambda: pids().get(MAIN) not in (None, before[MAIN]), timeout_s=120)
    assert ask(MAIN)
    assert pids()[FIM] == before[FIM]
    state = models(srv)
    assert (state[MAIN]["worker_restarts"] - restarts[MAIN], state[FIM]["worker_restarts"] - restarts[FIM]) == (1, 0)
    assert state[MAIN]["state"] == state[FIM]["state"] == "loaded"
