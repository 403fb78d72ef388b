"""superfluid_last_tick_* on a fleet head: each worker's last tick, labelled with its worker and
host as superfluid_fleet_lanes is. It was the first worker's (by id) with no label saying so: a
slow tick on any other worker never showed."""

from __future__ import annotations

from typing import Any

from api.metrics import snapshot_families

from .test_fleet_view_s46 import fleet_head, worker_state


def samples(state: dict[str, Any], name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for fam in snapshot_families(state) for s in fam.samples if s.name == name]


def with_tick(state: dict[str, Any], seconds: float, lanes: int, prefill: int) -> dict[str, Any]:
    state["metrics"]["last_tick"] = {"tick": 7, "prefill_tokens": prefill, "decode_tokens": lanes, "lanes": lanes, "seconds": seconds}
    return state


def test_each_workers_last_tick_is_its_own_sample_named_by_worker_and_host() -> None:
    link = fleet_head({"a": with_tick(worker_state("h1", [None], {}), 0.01, 1, 0), "b": with_tick(worker_state("h2", [None, None], {}), 2.5, 2, 512)}, {})
    state = link.snapshot
    assert state is not None
    # was one sample, 0.01: worker a's, whose tick was fast; b's 2.5 s tick never showed
    assert sorted(samples(state, "superfluid_last_tick_seconds"), key=lambda s: s[0]["worker"]) == [({"worker": "a", "host": "h1"}, 0.01), ({"worker": "b", "host": "h2"}, 2.5)]
    assert ({"worker": "b", "host": "h2"}, 2.0) in samples(state, "superfluid_last_tick_lanes")
    assert ({"worker": "b", "host": "h2", "kind": "prefill"}, 512.0) in samples(state, "superfluid_last_tick_tokens")
    assert dict(state["metrics"])["last_tick"]["seconds"] == 0.01  # the dashboard's Tick panel: the first worker's, named there


def test_one_machine_keeps_its_unlabelled_last_tick() -> None:
    state = {"metrics": {"last_tick": {"prefill_tokens": 40, "decode_tokens": 3, "lanes": 1, "seconds": 0.05}}}
    assert samples(state, "superfluid_last_tick_seconds") == [({}, 0.05)]
    assert samples(state, "superfluid_last_tick_lanes") == [({}, 1.0)]
    assert samples(state, "superfluid_last_tick_tokens") == [({"kind": "prefill"}, 40.0), ({"kind": "decode"}, 3.0)]
