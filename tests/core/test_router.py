"""The model router (request-priority seed across models): score order, swaps, TTL, reorders.

A fake clock drives it; a small ``Box`` carries out its actions the way serve does (a load
finishes when the box says so, an unload at once) and records the order requests start in.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.router import ModelSpec, ModelState, Router, RouterConfig

from .builders import RouterLoop


class Box(RouterLoop):
    def __init__(self, models: list[ModelSpec] | list[str], **config: object) -> None:
        super().__init__([m if isinstance(m, ModelSpec) else ModelSpec(m) for m in models], **config)
        self.swaps: list[tuple[str, str]] = []  # ("load"|"unload", model)
        self.auto_load = True
        self._n = 0

    def later(self, seconds: float) -> None:
        """``seconds`` pass; the router acts on them (its TTLs, its aging)."""
        self.clock.advance(seconds)
        self.settle()

    def ask(self, model: str, priority: int = 0, rid: str | None = None) -> str:
        self._n += 1
        rid = rid or f"{model}{self._n}"
        self.router.submit(rid, model, priority)
        self.clock.advance(0.001)
        self.settle()
        return rid

    def unload(self, model: str) -> None:
        self.swaps.append(("unload", model))
        self.router.unloaded(model)

    def load(self, model: str) -> None:
        self.swaps.append(("load", model))
        if self.auto_load:
            self.router.loaded(model)

    def finish(self, rid: str) -> None:
        self.clock.advance(0.001)
        self.router.finished(rid)
        self.settle()

    def state(self, model: str) -> ModelState:
        return self.router.state(model)


# -- the done-when orderings (max_loaded_models 1) -----------------------------------


def test_with_the_bonus_a_second_request_for_the_loaded_model_starts_before_an_older_one_needing_a_swap() -> None:
    box = Box(["A", "B"], swap_affinity_bonus=10)
    a1 = box.ask("A")
    b = box.ask("B")
    a2 = box.ask("A")
    # a1 runs; b waits for A to finish (non-preemptive); a2 joins A's worker at once
    assert box.started == [a1, a2]
    assert box.state("A") is ModelState.DRAINING
    box.finish(a1)
    box.finish(a2)
    assert box.started == [a1, a2, b]
    assert box.swaps == [("load", "A"), ("unload", "A"), ("load", "B")]
    assert box.router.reorders == {"swap_affinity": 1, "aging": 0}


def test_with_the_bonus_at_zero_it_is_exact_arrival_order_and_nothing_is_counted() -> None:
    box = Box(["A", "B"], swap_affinity_bonus=0)
    a1 = box.ask("A")
    b = box.ask("B")
    a2 = box.ask("A")
    assert box.started == [a1]  # a2 waits behind b: A is reserved for b's swap
    box.finish(a1)
    assert box.started == [a1, b]
    box.finish(b)
    assert box.started == [a1, b, a2]
    assert box.router.reorders == {"swap_affinity": 0, "aging": 0}


def test_one_lane_each_the_bonus_keeps_the_second_request_for_the_loaded_model_first() -> None:
    box = Box([ModelSpec("A", lanes=1), ModelSpec("B", lanes=1)], swap_affinity_bonus=10)
    a1, b, a2 = box.ask("A"), box.ask("B"), box.ask("A")
    assert box.started == [a1] and box.state("A") is ModelState.LOADED  # a2 claims A: b cannot reserve it
    box.finish(a1)
    assert box.started == [a1, a2] and box.state("A") is ModelState.DRAINING
    box.finish(a2)
    assert box.started == [a1, a2, b]
    assert box.router.reorders["swap_affinity"] == 1


def test_a_higher_priority_request_for_another_model_goes_before_a_queued_one_for_the_loaded_model() -> None:
    box = Box([ModelSpec("A", lanes=1), ModelSpec("B", lanes=1)])
    a1 = box.ask("A")
    box.ask("A", rid="a2")  # no lane free: it waits at the router, not at A's worker
    box.ask("B", 100, rid="b")
    assert box.started == [a1]
    box.finish(a1)
    assert box.started == [a1, "b"]
    box.finish("b")
    assert box.started == [a1, "b", "a2"]


def test_an_interactive_request_goes_to_a_full_model_whose_worker_preempts_for_it() -> None:
    box = Box([ModelSpec("A", lanes=1), ModelSpec("B", lanes=1)])
    box.ask("A", rid="agent")
    box.router.submit("chat", "A", 100, preempts=True)
    box.router.submit("batch", "A", -100)
    box.settle()
    assert box.started == ["agent", "chat"]


def test_a_worse_interactive_request_does_not_overtake_a_better_one_waiting_for_the_lane() -> None:
    """Preemption is the worker's way to make room for an urgent class, not a way past the
    router's order: a normal-class request whose priority header scores it above the chat keeps
    its turn for the lane, and the chat goes after it."""
    box = Box([ModelSpec("A", lanes=1)])
    box.ask("A", rid="agent")
    box.router.submit("urgent", "A", 150)
    box.router.submit("chat", "A", 100, preempts=True)
    box.settle()
    assert box.started == ["agent"]
    box.finish("agent")
    assert box.started == ["agent", "urgent", "chat"]


def test_a_request_with_several_choices_takes_a_lane_for_each_and_nothing_worse_overtakes_it() -> None:
    """n choices run as n jobs at the worker, a lane each: a 3-choice request waits while only
    two of four lanes are free, and a later one-choice request does not slip past it into them
    (it would take the lanes the better request waits for); an interactive one still goes."""
    box = Box([ModelSpec("A", lanes=4)])
    box.router.submit("two", "A", jobs=2)
    box.router.submit("three", "A", jobs=3)
    box.router.submit("one", "A")
    box.router.submit("chat", "A", 100, preempts=True)
    box.settle()
    assert box.started == ["chat", "two"]  # chat by score, then "two": 2 + 2 of 4 lanes
    assert box.router.snapshot()["models"]["A"]["lanes_taken"] == 3  # type: ignore[index]
    box.finish("chat")
    assert box.started == ["chat", "two"]  # one lane free: "three" waits, "one" stays behind it
    box.finish("two")
    assert box.started == ["chat", "two", "three", "one"]


def test_a_request_with_more_choices_than_lanes_starts_once_its_model_is_free() -> None:
    box = Box([ModelSpec("A", lanes=2)])
    box.router.submit("one", "A")
    box.router.submit("eight", "A", jobs=8)  # its worker queues what does not fit
    box.router.submit("other", "A")
    box.settle()
    assert box.started == ["one"]
    box.finish("one")
    assert box.started == ["one", "eight"]
    box.finish("eight")
    assert box.started == ["one", "eight", "other"]
    with pytest.raises(ValueError):
        box.router.submit("none", "A", jobs=0)


def test_a_swap_waits_for_admitted_work_and_cuts_nothing() -> None:
    box = Box(["A", "B"], swap_affinity_bonus=0)
    a1, a2 = box.ask("A"), box.ask("A")
    b = box.ask("B")
    assert box.started == [a1, a2]
    box.finish(a1)
    assert box.state("A") is ModelState.DRAINING and b not in box.started
    box.finish(a2)
    assert box.started[-1] == b and box.state("A") is ModelState.UNLOADED


def test_a_swap_reservation_stays_on_the_busy_model_it_chose_while_their_work_comes_and_goes() -> None:
    """With two slots and both models busy, the swap reserves one of them. When a request of the
    reserved model ends, the model's last use moves; were the victim chosen afresh by last use,
    the reservation would jump to the other busy model, the first would take new work again, and
    with traffic on both the swapping request would never start."""
    box = Box([ModelSpec("A", lanes=2), ModelSpec("B", lanes=2), ModelSpec("C", lanes=2)], max_loaded_models=2, swap_affinity_bonus=0)
    a1, a2 = box.ask("A"), box.ask("A")
    b1, _b2 = box.ask("B"), box.ask("B")
    c = box.ask("C")
    assert box.state("A") is ModelState.DRAINING  # the least recently used busy model
    a3 = box.ask("A")
    box.finish(a1)
    assert box.state("A") is ModelState.DRAINING and a3 not in box.started
    b3 = box.ask("B")
    box.finish(b1)
    assert box.state("A") is ModelState.DRAINING and b3 in box.started
    box.finish(a2)
    assert c in box.started and box.state("A") is ModelState.UNLOADED and a3 not in box.started


def test_a_reservation_is_given_up_when_the_request_that_made_it_leaves() -> None:
    box = Box(["A", "B"], swap_affinity_bonus=0)
    a1 = box.ask("A")
    b = box.ask("B")
    a2 = box.ask("A")
    assert box.state("A") is ModelState.DRAINING
    box.router.cancel(b)
    box.settle()
    assert box.state("A") is ModelState.LOADED and box.started == [a1, a2]


# -- the seed's bands ------------------------------------------------------------------------


def test_tier_offsets_order_inside_the_batch_band_and_all_stay_below_normal() -> None:
    box = Box(["A", "B"], swap_affinity_bonus=0)
    box.ask("A", rid="busy")
    for rid, priority in [("free", -100), ("pro", -99), ("max", -98), ("normal", 0)]:
        box.router.submit(rid, "B", priority)
    box.settle()
    box.finish("busy")
    for rid in ("normal", "max", "pro"):
        box.finish(rid)
    assert box.started == ["busy", "normal", "max", "pro", "free"]


@pytest.mark.parametrize("bonus", [1, 10, 99])
def test_the_swap_affinity_bonus_never_crosses_a_band(bonus: int) -> None:
    # a normal request for the loaded model against an interactive one needing a swap
    box = Box(["A", "B"], swap_affinity_bonus=bonus)
    box.ask("A", rid="busy")
    box.router.submit("interactive-B", "B", 100)
    box.clock.advance(0.001)
    box.router.submit("normal-A", "A", 0)
    box.settle()
    box.finish("busy")
    assert box.started == ["busy", "interactive-B"]
    # and a batch job with the bonus stays below a normal request (0): a max member's (-98) while
    # offset + bonus < 100 (the seed's invariant), a plain one (-100) even at the cap of 99
    batch = -98 if bonus <= 97 else -100
    box = Box(["A", "B"], swap_affinity_bonus=bonus)
    box.ask("A", rid="busy")
    box.router.submit("normal-B", "B", 0)
    box.clock.advance(0.001)
    box.router.submit("batch-A", "A", batch)
    box.settle()
    box.finish("busy")
    assert box.started == ["busy", "normal-B"]


@pytest.mark.parametrize(("rival", "waited_min", "batch_first"), [(0, 99, False), (0, 101, True), (100, 199, False), (100, 201, True)])
def test_a_batch_request_overtakes_normal_traffic_only_after_about_100_minutes(rival: int, waited_min: int, batch_first: bool) -> None:
    """Aging is unbounded: it crosses bands on purpose, two of them too (-100 + 201 minutes at a
    minute a point beats a fresh +100)."""
    box = Box(["A", "B"], swap_affinity_bonus=0, aging_divisor_s=60)
    box.ask("A", rid="busy")
    box.router.submit("batch", "B", -100)
    box.clock.advance(waited_min * 60)
    box.router.submit("normal", "B", rival)
    box.settle()
    box.finish("busy")
    assert box.started[1] == ("batch" if batch_first else "normal")
    assert box.router.reorders["aging"] == (1 if batch_first else 0)


def test_aging_zero_disables_it() -> None:
    box = Box(["A", "B"], swap_affinity_bonus=0, aging_divisor_s=0)
    box.ask("A", rid="busy")
    box.router.submit("batch", "B", -100)
    box.clock.advance(10 * 24 * 3600)
    box.router.submit("normal", "B", 0)
    box.settle()
    box.finish("busy")
    assert box.started[1] == "normal"


def test_fifo_adds_the_header_to_the_models_priority() -> None:
    box = Box([ModelSpec("A"), ModelSpec("B", priority=10), ModelSpec("C")], scheduler="fifo")
    box.ask("A", rid="busy")
    box.router.submit("c-normal", "C", -89)  # queues at -89
    box.router.submit("b-batch", "B", -100)  # 10 - 100 = -90
    box.router.submit("c-low", "C", -91)
    box.settle()
    assert box.started == ["busy"]
    box.finish("busy")
    box.finish("c-normal")
    box.finish("b-batch")
    assert box.started == ["busy", "c-normal", "b-batch", "c-low"]
    assert box.dispatches["b-batch"].score == -90  # type: ignore[attr-defined]
    assert box.router.reorders == {"swap_affinity": 0, "aging": 0}


# -- loading, slots, TTL, admin ----------------------------------------------------------------


def test_requests_for_a_loading_model_wait_until_it_is_loaded() -> None:
    box = Box(["A"])
    box.auto_load = False
    box.ask("A", rid="a1")
    box.ask("A", rid="a2")
    assert box.started == [] and box.state("A") is ModelState.LOADING
    box.clock.advance(2.5)
    assert box.router.loaded("A") == pytest.approx(2.501)
    box.settle()
    assert box.started == ["a1", "a2"]


def test_a_model_loaded_for_a_request_serves_it_before_a_better_request_can_swap_it_out() -> None:
    """Dispatch is non-preemptive and a swap starts at the pick of the request it is for: a
    better request for another model that arrives while that load runs waits for the request
    the model was loaded for, instead of having the fresh model unloaded again unused."""
    box = Box(["A", "B"], swap_affinity_bonus=10)
    box.finish(box.ask("A", rid="a0"))  # A loaded and idle
    box.auto_load = False
    box.ask("B", rid="b")  # A goes, B loads for b
    assert box.state("B") is ModelState.LOADING
    box.ask("A", rid="a", priority=100)  # better than b, for the model just unloaded
    box.router.loaded("B")
    box.settle()
    assert box.started == ["a0", "b"]  # b runs on the model loaded for it
    assert box.state("B") is ModelState.DRAINING  # reserved for a's swap once b is done
    box.auto_load = True
    box.finish("b")
    assert box.started == ["a0", "b", "a"]
    assert box.swaps == [("load", "A"), ("unload", "A"), ("load", "B"), ("unload", "B"), ("load", "A")]


def test_the_slot_a_swap_freed_loads_the_model_of_the_request_it_was_started_for() -> None:
    """A better request for a third model that arrives while the victim unloads waits: the
    slot goes to the model of the request whose pick started the swap."""
    box = Box(["A", "B", "C"], swap_affinity_bonus=10)
    box.finish(box.ask("A", rid="a0"))  # A loaded and idle
    box.router.submit("b", "B", 0)
    actions = box.router.schedule()  # b's pick: A unloads
    assert actions.unload == ["A"] and not actions.load
    box.router.submit("c", "C", 100)  # better, while A stops
    box.unload("A")
    box.settle()
    assert box.started == ["a0", "b"]
    box.finish("b")
    assert box.started == ["a0", "b", "c"]
    assert box.swaps == [("load", "A"), ("unload", "A"), ("load", "B"), ("unload", "B"), ("load", "C")]


def test_two_slots_hold_two_models_and_a_third_evicts_the_idle_one() -> None:
    box = Box(["A", "B", "C"], max_loaded_models=2)
    box.ask("A", rid="a")
    box.ask("B", rid="b")
    assert {box.state("A"), box.state("B")} == {ModelState.LOADED}
    box.finish("b")  # B idle, A busy
    box.ask("C", rid="c")
    assert box.started == ["a", "b", "c"]
    assert box.state("B") is ModelState.UNLOADED and box.state("A") is ModelState.LOADED


def test_a_load_that_fails_drops_only_that_models_waiting_requests() -> None:
    box = Box(["A", "B"], max_loaded_models=2)
    box.auto_load = False
    box.ask("A", rid="a")
    box.ask("B", rid="b")
    assert box.router.load_failed("B") == ["b"]
    box.router.loaded("A")
    box.settle()
    assert box.started == ["a"] and box.state("B") is ModelState.UNLOADED


def test_ttl_unloads_an_idle_model_and_never_a_busy_one() -> None:
    box = Box([ModelSpec("A", ttl_s=300), ModelSpec("B")], max_loaded_models=2)
    box.ask("A", rid="a")
    box.ask("B", rid="b")
    box.later(1000)
    assert box.state("A") is ModelState.LOADED  # still running a
    box.finish("a")
    box.later(299)
    assert box.state("A") is ModelState.LOADED
    box.later(2)
    assert box.state("A") is ModelState.UNLOADED
    assert box.state("B") is ModelState.LOADED  # ttl 0: never


def test_admin_load_and_unload() -> None:
    box = Box(["A", "B"])
    box.router.request_load("B")
    box.settle()
    assert box.state("B") is ModelState.LOADED
    box.ask("B", rid="b")
    box.router.request_unload("B")
    box.settle()
    assert box.state("B") is ModelState.DRAINING  # b still runs
    box.ask("B", rid="b2")
    assert "b2" not in box.started
    box.finish("b")
    assert box.swaps[-2:] == [("unload", "B"), ("load", "B")]  # b2 loads it again
    assert box.started[-1] == "b2"


def test_dispatch_records_the_serial_fields() -> None:
    box = Box(["A", "B"])
    box.ask("A", rid="busy")
    box.router.submit("b", "B", -98)
    box.later(30)
    box.finish("busy")
    fields = box.dispatches["b"].serial_fields()  # type: ignore[attr-defined]
    assert fields == {"serial_priority": -98, "serial_band": "batch", "serial_score": pytest.approx(-97.5, abs=0.01), "serial_queue_wait_ms": 30001}


def test_unknown_model_and_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="swapAffinityBonus"):
        RouterConfig(swap_affinity_bonus=100)
    with pytest.raises(ValueError, match="max_loaded_models"):
        RouterConfig(max_loaded_models=0)
    router = Router([ModelSpec("A")])
    with pytest.raises(KeyError):
        router.submit("x", "nope")


# -- properties ------------------------------------------------------------------------------


def running(box: Box) -> list[str]:
    return [r for r in box.started if r in box.router._dispatched]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("ABC"), st.integers(-150, 150), st.integers(0, 3), st.integers(1, 4)), min_size=1, max_size=25),
    st.integers(1, 3),
    st.integers(0, 99),
    st.integers(0, 3),
)
def test_every_request_runs_once_and_resident_models_never_exceed_the_limit(script, max_loaded, bonus, lanes) -> None:  # type: ignore[no-untyped-def]
    box = Box([ModelSpec(m, lanes=lanes) for m in "ABC"], max_loaded_models=max_loaded, swap_affinity_bonus=bonus)
    for i, (model, priority, finish_n, jobs) in enumerate(script):
        box.router.submit(f"r{i}", model, priority, preempts=priority > 100, jobs=jobs)
        box.later(1)
        for rid in running(box)[:finish_n]:
            box.finish(rid)
        assert sum(box.state(m) is not ModelState.UNLOADED for m in "ABC") <= max_loaded
        if lanes:  # requests that do not preempt never hold more of their model's lanes than it has
            for m in "ABC":
                plain = [min(script[int(r[1:])][3], lanes) for r in running(box) if box.router._dispatched[r][0] == m and script[int(r[1:])][1] <= 100]
                assert sum(plain) <= lanes
    for _ in range(100):
        if not running(box) and not box.router.waiting:
            break
        for rid in running(box):
            box.finish(rid)
    assert sorted(box.started) == sorted(f"r{i}" for i in range(len(script)))
    assert len(set(box.started)) == len(box.started)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from("AB"), min_size=1, max_size=20))
def test_bonus_zero_and_equal_priorities_is_exact_fifo(models) -> None:  # type: ignore[no-untyped-def]
    box = Box(["A", "B"], swap_affinity_bonus=0)
    box.ask("A", rid="busy")
    for i, model in enumerate(models):
        box.router.submit(f"r{i}", model, 0)
        box.later(1)
    for _ in range(100):
        if not running(box) and not box.router.waiting:
            break
        box.finish(running(box)[0])
    assert box.started == ["busy", *(f"r{i}" for i in range(len(models)))]
    assert box.router.reorders == {"swap_affinity": 0, "aging": 0}


# -- a pinned model (serve --fim-model): resident beside the swapped ones -----------------------


def test_a_pinned_model_stays_resident_beside_the_swapped_one_and_takes_no_swap_slot() -> None:
    box = Box([ModelSpec("A"), ModelSpec("B"), ModelSpec("F", lanes=2, ttl_s=5, pinned=True)], max_loaded_models=1)
    box.router.request_load("F")
    box.settle()
    assert box.state("F") is ModelState.LOADED
    a = box.ask("A")  # the one swap slot is still free: F does not hold it
    assert box.started == [a] and box.state("A") is ModelState.LOADED
    b = box.ask("B")
    f = box.ask("F")  # its own lanes: it starts at once, not behind A's work nor B's swap
    assert box.started == [a, f]
    box.finish(a)
    assert box.started == [a, f, b]
    assert box.swaps == [("load", "F"), ("load", "A"), ("unload", "A"), ("load", "B")]  # F never a victim
    box.finish(f)
    box.later(60)
    assert box.state("F") is ModelState.LOADED  # no TTL for it


def test_a_pinned_models_lanes_bound_only_its_own_requests() -> None:
    box = Box([ModelSpec("A", lanes=1), ModelSpec("F", lanes=2, pinned=True)])
    box.router.request_load("F")
    a1 = box.ask("A")
    a2 = box.ask("A")
    f1, f2, f3 = box.ask("F"), box.ask("F"), box.ask("F")
    assert box.started == [a1, f1, f2]
    box.finish(f1)
    assert box.started == [a1, f1, f2, f3]
    assert box.router.snapshot()["models"]["F"]["dispatched"] == 3  # type: ignore[index]
    assert box.router.snapshot()["models"]["A"]["dispatched"] == 1  # type: ignore[index]
    assert a2 not in box.started


def test_the_snapshot_counts_each_models_waiting_requests_by_band() -> None:
    box = Box([ModelSpec("A", lanes=1), ModelSpec("B")])
    box.ask("A")
    box.ask("A", priority=-100)
    box.ask("B", priority=100)
    box.ask("A", priority=5)
    models = box.router.snapshot()["models"]
    assert models["A"]["waiting_by_band"] == {"interactive": 0, "normal": 1, "batch": 1}  # type: ignore[index]
    assert models["B"]["waiting_by_band"] == {"interactive": 1, "normal": 0, "batch": 0}  # type: ignore[index]


def test_an_unload_asked_while_loading_ends_with_a_failed_load() -> None:
    """The admin unloads a model that is still loading, and the load fails: the unload was
    still pending, so the next ordinary load drained and unloaded the model at once, its request
    still waiting, and served it only after a third load."""
    box = Box(["a", "b"], max_loaded_models=1)
    box.auto_load = False
    box.ask("a")
    assert box.state("a") is ModelState.LOADING
    box.router.request_unload("a")
    box.router.load_failed("a")
    box.auto_load = True
    box.later(box.router.backoff_left("a"))  # the failed load's backoff (tests/core/test_router_load_backoff_s46.py)
    box.ask("a", rid="again")
    assert box.started == ["again"] and box.state("a") is ModelState.LOADED
    assert box.swaps == [("load", "a"), ("load", "a")]


def test_unloading_the_pinned_fim_model_does_not_hold_back_an_unrelated_swap() -> None:
    """A pinned model's stop frees no slot; counting it as one coming made a request for b wait
    for the FIM model's work and stop instead of swapping out the idle a."""
    box = Box([ModelSpec("a"), ModelSpec("b"), ModelSpec("fim", pinned=True)], max_loaded_models=1)
    box.router.request_load("fim")
    box.settle()
    box.finish(box.ask("a"))  # a loaded and idle
    box.ask("fim", rid="fill")  # the FIM model busy
    box.router.request_unload("fim")
    box.settle()
    box.ask("b", rid="b1")
    assert "b1" in box.started and box.state("b") is ModelState.LOADED and box.state("a") is ModelState.UNLOADED


def test_a_request_that_needed_a_load_is_recorded_with_the_score_it_won_with_no_swap_bonus() -> None:
    """serial_score is the score a request won with: one whose model was not loaded won without
    the swap affinity bonus (it was recorded with it: the model was marked loading first)."""
    box = Box(["A", "B"], max_loaded_models=1, swap_affinity_bonus=10, aging_divisor_s=0)
    box.ask("A", priority=0, rid="first")
    assert box.swaps == [("load", "A")] and box.dispatches["first"].score == 0  # type: ignore[attr-defined]
    box.ask("A", priority=0, rid="second")  # the model is loaded now: it won with the bonus
    box.finish("first")
    assert box.dispatches["second"].score == 10  # type: ignore[attr-defined]


def test_the_admins_load_waits_for_an_idle_model_and_never_shows_a_busy_one_draining() -> None:
    """A Load happens "when a slot is free or an idle model can go": a busy model was reserved
    for it and shown draining while it went on taking new work."""
    box = Box([ModelSpec("A", lanes=2), ModelSpec("B", lanes=2)], max_loaded_models=1)
    box.ask("A", rid="a1")
    box.router.request_load("B")
    box.settle()
    assert box.state("A") is ModelState.LOADED and box.swaps == [("load", "A")]
    box.ask("A", rid="a2")
    assert box.started == ["a1", "a2"] and box.state("A") is ModelState.LOADED
    box.finish("a1")
    assert box.state("A") is ModelState.LOADED  # a2 still runs there
    box.finish("a2")
    assert box.swaps == [("load", "A"), ("unload", "A"), ("load", "B")] and box.state("B") is ModelState.LOADED


# -- serve's shutdown (Router.drain) -----------------------------------------------------------


def test_a_drain_keeps_the_requests_waiting_for_a_loaded_models_lanes_and_serves_them_best_first() -> None:
    """They were accepted: each still gets its turn as a lane frees, in score order, and nothing
    is unloaded meanwhile, even past the model's TTL. Nothing new may come in."""
    box = Box([ModelSpec("a", lanes=1, ttl_s=5)], aging_divisor_s=0)
    running = box.ask("a")
    low, high = box.ask("a", priority=1), box.ask("a", priority=5)
    assert box.router.drain() == []
    box.finish(running)
    box.finish(high)
    assert box.started == [running, high, low] and not box.router.idle("a")
    box.finish(low)
    box.later(60)
    assert box.swaps == [("load", "a")] and box.router.idle("a")
    with pytest.raises(RuntimeError):
        box.router.submit("late", "a")


def test_a_drain_voids_a_swap_reservation_and_drops_the_request_it_was_for() -> None:
    """No worker starts any more: the request that reserved the busy model for its swap ends,
    and the reserved model serves its own waiting request again."""
    box = Box([ModelSpec("a", lanes=1), ModelSpec("b", lanes=1)], max_loaded_models=1)
    busy = box.ask("a")
    for_b = box.ask("b", priority=50)  # needs a swap: a is reserved for it
    after_b = box.ask("a")
    assert box.state("a") is ModelState.DRAINING
    assert box.router.drain() == [for_b]
    box.settle()
    assert box.state("a") is ModelState.LOADED and box.started == [busy]
    box.finish(busy)
    assert box.started == [busy, after_b] and box.swaps == [("load", "a")]


def test_a_drain_drops_the_requests_of_a_model_still_loading_or_being_unloaded_by_the_admin() -> None:
    box = Box([ModelSpec("a", lanes=1), ModelSpec("b", lanes=1), ModelSpec("c", lanes=1)], max_loaded_models=3)
    box.auto_load = False
    loading = box.ask("a")
    box.router.loaded("b")  # not asked for: the admin's Load would do this
    box.auto_load = True
    b_busy = box.ask("b")
    b_next = box.ask("b")
    box.router.request_unload("b")
    box.settle()
    assert box.state("b") is ModelState.DRAINING
    assert sorted(box.router.drain()) == sorted([loading, b_next])
    assert not box.router.idle("b")  # its running request still runs
    box.finish(b_busy)
    assert box.router.idle("b") and box.started == [b_busy]


def test_the_admins_load_and_unload_during_a_drain_change_nothing() -> None:
    """The accepted requests still run: an Unload asked during serve's shutdown would otherwise
    hold them back from their loaded model forever, and the drain would never end."""
    box = Box([ModelSpec("a", lanes=1), ModelSpec("b", lanes=1)], max_loaded_models=2)
    running, queued = box.ask("a"), box.ask("a")
    assert box.router.drain() == []
    box.router.request_unload("a")
    box.router.request_load("b")
    box.settle()
    assert box.state("a") is ModelState.LOADED and box.state("b") is ModelState.UNLOADED
    box.finish(running)
    box.finish(queued)
    assert box.started == [running, queued] and box.router.idle("a")
