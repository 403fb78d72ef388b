"""Several models behind one server (serve --config): the bundled GGUF under two ids, one loaded
at a time, one lane each. The router's order (request-priority seed), swaps, TTL, aliases."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scheduler.engines.models import default_model_path

from .server import RunningServer, openai_client, serving, stream_text

pytestmark = [pytest.mark.e2e, pytest.mark.model]


def config(bonus: int, b_ttl: int = 0, max_loaded: int = 1) -> str:
    gguf = default_model_path()
    return f"""\
models:
  a:
    model: {gguf}
    aliases: [alpha]
    max_batch: 1
    ctx_size: 1024
  b:
    model: {gguf}
    aliases: [beta]
    max_batch: 1
    ctx_size: 1024
    ttl: {b_ttl}
max_loaded_models: {max_loaded}
routing:
  scheduler:
    use: serial
    settings:
      serial:
        agingDivisor: 60
        swapAffinityBonus: {bonus}
"""


def config_file(bonus: int, b_ttl: int = 0, max_loaded: int = 1) -> str:
    path = Path(tempfile.mkdtemp(prefix="superfluid-models-")) / "superfluid.yaml"
    path.write_text(config(bonus, b_ttl, max_loaded))
    return str(path)


@pytest.fixture(scope="module")
def bonus10() -> Iterator[RunningServer]:
    with serving("--config", config_file(10, b_ttl=2)) as srv:
        yield srv


def models_state(srv: RunningServer) -> dict[str, dict]:
    return {m["id"]: m for m in httpx.get(srv.base + "/v1/internal/models", timeout=5).json()["data"]}


def metric(srv: RunningServer, line_start: str) -> float:
    for line in httpx.get(srv.base + "/metrics", timeout=5).text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{line_start} not on /metrics")


LONG = {"prompt": "Counting to five hundred: 1, 2, 3, 4, 5, 6,", "max_tokens": 80, "temperature": 0}


class Run:
    """One streamed completion on a thread; when its first token came."""

    def __init__(self, srv: RunningServer, model: str, priority: int = 0, long: bool = False) -> None:
        body = {"_path": "/v1/completions", "model": model, "stream": True, **(LONG if long else {"prompt": "Hello", "max_tokens": 4, "temperature": 0})}
        self.first = threading.Event()
        self.first_at = 0.0
        self.text = ""
        self.error: BaseException | None = None

        def on_chunk(n: int) -> None:
            if n == 1:
                self.first_at = time.monotonic()
                self.first.set()

        def run() -> None:
            try:
                self.text, _ = stream_text(srv.base, body, {"x-llamaswap-priority": str(priority)}, on_chunk=on_chunk, timeout_s=600)
            except BaseException as exc:  # noqa: BLE001 - re-raised by join()
                self.error = exc

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def join(self) -> None:
        self.thread.join(900)
        assert self.error is None, self.error
        assert self.first.is_set(), "no token arrived"


def waiting(srv: RunningServer, model: str, n: int) -> None:
    srv.wait_for(lambda: models_state(srv)[model]["waiting"] == n, timeout_s=30)


def scenario(srv: RunningServer, second: tuple[str, int], third: tuple[str, int]) -> tuple[Run, Run, Run]:
    """A long request running on a, then ``second``, then ``third`` (model, priority)."""
    srv.wait_for(lambda: models_state(srv)["a"]["running"] == 0 and models_state(srv)["b"]["running"] == 0, timeout_s=60)
    long = Run(srv, "a", long=True)
    assert long.first.wait(120)
    r2 = Run(srv, *second)
    waiting(srv, second[0], 1)  # one lane each: it waits at the router, whichever model it is for
    r3 = Run(srv, *third)
    waiting(srv, third[0], 1 + (third[0] == second[0]))
    assert long.thread.is_alive(), "the long request ended before the others queued"
    for r in (long, r2, r3):
        r.join()
    return long, r2, r3


def test_with_the_bonus_the_second_request_for_the_loaded_model_starts_before_the_swap(bonus10: RunningServer) -> None:
    before = metric(bonus10, 'llamaswap_scheduler_reorders_total{reason="swap_affinity"}')
    _long, b, a2 = scenario(bonus10, ("b", 0), ("a", 0))
    assert a2.first_at < b.first_at
    assert metric(bonus10, 'llamaswap_scheduler_reorders_total{reason="swap_affinity"}') == before + 1


def test_a_higher_priority_request_for_another_model_goes_before_a_queued_one(bonus10: RunningServer) -> None:
    # swap affinity gives the queued a-request 10, priority 100 on b beats it
    _long, a2, b = scenario(bonus10, ("a", 0), ("b", 100))
    assert b.first_at < a2.first_at


def test_both_models_answer_the_openai_client_by_id_and_alias_and_ttl_unloads(bonus10: RunningServer) -> None:
    client = openai_client(bonus10.base)
    listed = {m.id for m in client.models.list().data}
    assert listed == {"a", "alpha", "b", "beta"}
    for name in ("alpha", "b", "a", "beta"):
        out = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        assert out.model == name and out.choices[0].message.content
    # b has ttl 2: it unloads once idle, and says so in the admin route and on /metrics
    bonus10.wait_for(lambda: models_state(bonus10)["b"]["state"] == "unloaded", timeout_s=30)
    assert metric(bonus10, 'superfluid_model_state{model="b",state="unloaded"}') == 1
    assert metric(bonus10, 'superfluid_model_loads_total{model="b"}') >= 2
    with pytest.raises(Exception) as err:
        client.chat.completions.create(model="gamma", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert getattr(err.value, "status_code", None) == 404
