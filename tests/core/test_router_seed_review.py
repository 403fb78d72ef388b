"""The model router against the request-priority seed, the rules the other router tests leave
unpinned: the score formula term by term, ties, unbounded aging, values beyond the anchors, the
settings' bounds and defaults, TTL against queued work, a failed load's queue, unknown models.
Fake clock only."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.core.router import ModelSpec, ModelState, Router, RouterConfig
from scheduler.models_config import ModelsConfig, ServedModel

from .test_router import Box


class SlowStop(Box):
    """Its unloads do not end: a model unloaded stays stopping."""

    def unload(self, model: str) -> None:
        self.swaps.append(("unload", model))


def test_the_score_is_priority_plus_swap_affinity_plus_waited_seconds_over_the_divisor() -> None:
    """serial: priority + bonus (its model resident) + waited / agingDivisor, a fractional
    divisor as it is; no bonus for a model not resident, nor for one being stopped (it needs a
    load again); fifo: the model's priority + the header, nothing else."""
    box = SlowStop([ModelSpec("A"), ModelSpec("B"), ModelSpec("C")], max_loaded_models=2, swap_affinity_bonus=10, aging_divisor_s=7.5)
    box.finish(box.ask("C"))
    box.ask("A", rid="busy")
    box.router.request_unload("C")
    box.settle()
    assert [box.state(m) for m in "ABC"] == [ModelState.LOADED, ModelState.UNLOADED, ModelState.UNLOADING]
    t0 = box.clock()
    a = box.router.submit("a", "A", 3)
    b = box.router.submit("b", "B", -98)
    c = box.router.submit("c", "C", 40)
    now = t0 + 45
    assert box.router.score(a, now) == pytest.approx(3 + 10 + 45 / 7.5)
    assert box.router.score(b, now) == pytest.approx(-98 + 0 + 45 / 7.5)
    assert box.router.score(c, now) == pytest.approx(40 + 0 + 45 / 7.5)
    fifo = Router([ModelSpec("A", priority=10), ModelSpec("B")], RouterConfig(scheduler="fifo"), clock=lambda: 0.0)
    fifo.submit("first", "A")
    assert fifo.schedule().load == ["A"]
    fifo.loaded("A")
    assert fifo.state("A") is ModelState.LOADED
    fa, fb = fifo.submit("a", "A", -100), fifo.submit("b", "B", 7)
    assert (fifo.score(fa, 1e6), fifo.score(fb, 1e6)) == (-90, 7)


def test_equal_scores_keep_arrival_order_when_aging_evens_out_two_priorities() -> None:
    """A request at 0 that waited 120 s and one at 1 that waited 60 s both score 12 (bonus 10,
    60 s a point): the older goes first, as the seed's "equal scores keep arrival order" says."""
    box = Box([ModelSpec("A", lanes=1)], swap_affinity_bonus=10, aging_divisor_s=60)
    box.router.submit("busy", "A")
    box.settle()
    box.router.submit("older", "A", 0)
    box.clock.advance(60)
    box.router.submit("newer", "A", 1)
    box.clock.advance(60)
    older, newer = box.router.order()
    assert box.router.score(older, box.clock()) == box.router.score(newer, box.clock()) == 12
    box.router.finished("busy")
    box.settle()
    assert box.started == ["busy", "older"]


def test_any_integer_is_a_priority_beyond_the_anchors_too() -> None:
    """The number is the interface: 150 before 100 before 0 before -100 before -150."""
    box = Box([ModelSpec("A", lanes=1)], aging_divisor_s=0)
    box.ask("A", rid="busy")
    for priority in (-150, 0, 150, -100, 100):
        box.router.submit(f"p{priority}", "A", priority)
    box.settle()
    for rid in ("busy", "p150", "p100", "p0", "p-100"):
        box.finish(rid)
    assert box.started == ["busy", "p150", "p100", "p0", "p-100", "p-150"]


def test_the_settings_bounds_and_defaults() -> None:
    """agingDivisor 60 s a point and swapAffinityBonus 10 by default, in the router and in a
    config file that sets neither; the bonus is 0..99 (0 and 99 taken, -1 and 100 refused), the
    divisor 0 or more."""
    assert (RouterConfig().aging_divisor_s, RouterConfig().swap_affinity_bonus, RouterConfig().scheduler) == (60.0, 10, "serial")
    assert ModelsConfig((ServedModel("a", Path("/m/a.gguf")),)).router_config() == RouterConfig()
    for ok in (0, 99):
        assert RouterConfig(swap_affinity_bonus=ok).swap_affinity_bonus == ok
    for bad in (-1, 100):
        with pytest.raises(ValueError, match="swapAffinityBonus"):
            RouterConfig(swap_affinity_bonus=bad)
    for divisor in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="agingDivisor"):
            RouterConfig(aging_divisor_s=divisor)


def test_a_request_arriving_after_the_ttl_passed_runs_on_the_loaded_model_without_a_reload() -> None:
    """The TTL tick had not run yet: the request is served by the model still loaded, no
    unload and load again."""
    box = Box([ModelSpec("A", ttl_s=300), ModelSpec("B")])
    box.finish(box.ask("A", rid="a1"))
    box.clock.advance(400)
    box.ask("A", rid="a2")
    assert box.started == ["a1", "a2"] and box.swaps == [("load", "A")] and box.state("A") is ModelState.LOADED


def test_the_ttl_never_unloads_a_model_with_work_waiting_or_running_and_counts_from_its_last_use() -> None:
    box = Box([ModelSpec("A", lanes=1, ttl_s=5)])
    box.ask("A", rid="a1")
    box.ask("A", rid="a2")  # waits at the router for A's one lane
    box.later(100)
    assert box.state("A") is ModelState.LOADED and box.started == ["a1"]
    box.finish("a1")
    assert box.started == ["a1", "a2"]
    box.later(100)
    assert box.state("A") is ModelState.LOADED
    box.finish("a2")
    box.later(4.9)
    assert box.state("A") is ModelState.LOADED
    box.later(0.2)
    assert box.state("A") is ModelState.UNLOADED and box.swaps == [("load", "A"), ("unload", "A")]


def test_a_failed_load_ends_every_request_waiting_for_it_and_its_slot_goes_to_the_next_model() -> None:
    """All of the model's waiting requests, whatever their priority, are handed back for an
    error; a request for another model waiting for the slot gets it; the model is tried again
    for the next request once the failed load's backoff has passed."""
    box = Box(["A", "B"], max_loaded_models=1)
    box.auto_load = False
    box.ask("A", 100, rid="a-high")
    box.ask("A", -100, rid="a-low")
    box.ask("B", 0, rid="b")
    assert box.state("A") is ModelState.LOADING and box.state("B") is ModelState.UNLOADED
    assert sorted(box.router.load_failed("A")) == ["a-high", "a-low"]
    box.auto_load = True
    box.settle()
    assert box.started == ["b"] and box.state("B") is ModelState.LOADED
    box.later(box.router.backoff_left("A"))
    box.ask("A", rid="again")
    box.finish("b")
    assert box.started == ["b", "again"] and box.state("A") is ModelState.LOADED


def test_an_unknown_model_is_refused_and_changes_nothing() -> None:
    box = Box(["A"])
    box.ask("A", rid="a")
    with pytest.raises(KeyError):
        box.router.submit("x", "a")  # ids are exact: the pool resolves aliases before this
    with pytest.raises(KeyError):
        box.router.request_load("nope")
    assert box.router.waiting == [] and box.router.snapshot()["models"].keys() == {"A"}  # type: ignore[attr-defined]
