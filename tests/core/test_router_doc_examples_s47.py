"""docs/scheduling.md's worked example under "Several models: the router", on the router's fake
clock with one lane per model and ``max_loaded_models`` 1: the exact figures the page gives."""

from __future__ import annotations

import pytest

from scheduler.core.router import ModelSpec

from .test_router import Box


def one_lane_each(bonus: int) -> Box:
    return Box([ModelSpec("A", lanes=1), ModelSpec("B", lanes=1)], swap_affinity_bonus=bonus)


@pytest.mark.parametrize(("bonus", "order"), [(10, ["busy", "A2", "B1"]), (0, ["busy", "B1", "A2"])])
def test_the_second_request_for_the_loaded_model_runs_before_the_swap_only_with_the_bonus(bonus: int, order: list[str]) -> None:
    """A long request on A, then one for B, then one for A (all priority 0): with the bonus at 10
    the second A request runs next; at 0 B was first and the second A request runs after it."""
    box = one_lane_each(bonus)
    box.ask("A", rid="busy")
    box.ask("B", rid="B1")
    box.ask("A", rid="A2")
    for rid in order:
        box.finish(rid)
    assert box.started == order


@pytest.mark.parametrize(("longer_s", "first"), [(59.999, "B100"), (60.0, "A0"), (61.0, "A0")])
def test_an_a_request_goes_before_b_at_100_once_it_waited_100_minus_the_bonus_times_the_divisor_longer(longer_s: float, first: str) -> None:
    """At a bonus of 99 and the default divisor (60 s a point) the A request (0 + 99 + its aging)
    ties B's 100 (+ its aging) once it has waited (100 - 99) x 60 = 60 s longer, and equal scores
    keep arrival order: 60 s, not the 61 s the page once gave; a moment less and B goes first."""
    box = one_lane_each(99)
    box.ask("A", rid="busy")
    box.router.submit("A0", "A", 0)
    box.clock.advance(longer_s)
    box.router.submit("B100", "B", 100)
    box.settle()
    box.clock.advance(5)
    box.finish("busy")
    assert box.started[1] == first
