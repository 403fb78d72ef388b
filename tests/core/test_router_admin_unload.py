"""The model router: a slot the admin is freeing must not hold a request back for
the length of another model's job when an idle model could go now. Fake clock only."""

from __future__ import annotations

from scheduler.core.router import ModelSpec, ModelState

from .test_router import Box


def test_a_request_does_not_wait_for_the_job_of_a_model_the_admin_unloads_when_an_idle_model_can_go() -> None:
    """Two slots: A runs a long job and the admin has asked to unload it; B is loaded and idle.
    A request for C waited for A's job to end (10 minutes here, a 12-hour batch for real) as
    for "a slot already on its way", though rule 2 swaps out an idle model at once."""
    box = Box([ModelSpec("A", lanes=1), ModelSpec("B"), ModelSpec("C")], max_loaded_models=2)
    box.ask("A", rid="long")
    box.finish(box.ask("B"))
    box.router.request_unload("A")
    box.settle()
    assert box.state("A") is ModelState.DRAINING
    box.ask("C", rid="c")
    assert "c" in box.started  # B made room; A's job still runs, nothing is cut
    assert box.state("B") is ModelState.UNLOADED and box.state("A") is ModelState.DRAINING
    box.finish("long")
    assert box.state("A") is ModelState.UNLOADED and box.state("C") is ModelState.LOADED


def test_with_no_idle_model_a_request_waits_for_the_slot_the_admin_frees_and_reserves_no_busy_model() -> None:
    """Both other models busy: the request waits for A's slot (the admin is freeing it) rather
    than stopping B from taking work."""
    box = Box([ModelSpec("A", lanes=1), ModelSpec("B", lanes=2), ModelSpec("C")], max_loaded_models=2)
    box.ask("A", rid="long")
    box.ask("B", rid="b1")
    box.router.request_unload("A")
    box.settle()
    box.ask("C", rid="c")
    assert box.state("B") is ModelState.LOADED  # not reserved
    box.ask("B", rid="b2")
    assert "b2" in box.started and "c" not in box.started
    box.finish("long")
    assert "c" in box.started and box.state("C") is ModelState.LOADED
