"""A model whose load failed (a corrupt or missing GGUF, a worker that crashes at start) is backed
off: for a while the router refuses its requests at once, so that a client retrying it (an
agent's retry loop) neither starts a load nor evicts the models other callers are served by.
5 s after the first failure, doubling with each failure in a row, 300 s at most; a successful
load ends it, the admin's Load bypasses and resets it. Fake clock only."""

from __future__ import annotations

import pytest

from scheduler.core.router import LoadBackoff, ModelSpec, ModelState, RouterConfig

from .test_router import Box


class Broken(Box):
    """Its loads of the models in ``broken`` fail (the worker dies at start); the others load."""

    def __init__(self, models: list[ModelSpec] | list[str], broken: set[str], **config: object) -> None:
        super().__init__(models, **config)
        self.broken = broken
        self.refused: list[tuple[str, float]] = []  # (model, retry after) of each refused request
        self.failed: list[str] = []  # request ids dropped by a failed load

    def load(self, model: str) -> None:
        self.swaps.append(("load", model))
        if model not in self.broken:
            self.router.loaded(model)

    def load_ends(self, model: str) -> None:
        """The broken model's worker gives up (the pool's ``_load_failed``)."""
        assert self.state(model) is ModelState.LOADING
        self.failed += self.router.load_failed(model)
        self.settle()

    def try_(self, model: str, rid: str | None = None) -> str | None:
        """A request for ``model``: its id if the router took it, None if refused for the backoff."""
        try:
            return self.ask(model, rid=rid)
        except LoadBackoff as refused:
            assert refused.model == model
            self.refused.append((model, round(refused.retry_after_s, 3)))
            return None


def test_a_request_for_a_model_whose_load_just_failed_is_refused_and_evicts_nothing() -> None:
    """One slot: A serves others' requests. A request for the broken B evicts A and fails; before,
    the very next request for B evicted A again (and reloaded it after), once per retry."""
    box = Broken(["A", "B"], broken={"B"}, max_loaded_models=1)
    box.ask("A", rid="a1")
    box.finish("a1")  # A loaded and idle: the first victim a swap would take
    box.try_("B", rid="b1")
    assert box.swaps == [("load", "A"), ("unload", "A"), ("load", "B")]
    box.load_ends("B")
    assert box.failed == ["b1"] and box.router.backoff_left("B") == 5.0
    box.ask("A", rid="a2")  # A is loaded again for its users
    assert box.started == ["a1", "a2"] and box.state("A") is ModelState.LOADED
    swaps = list(box.swaps)
    for _ in range(3):  # a client's retry loop
        assert box.try_("B") is None
        box.later(1)
    assert box.refused == [("B", 4.999), ("B", 3.999), ("B", 2.999)]  # the seconds left: the Retry-After
    assert box.swaps == swaps and box.state("A") is ModelState.LOADED and box.state("B") is ModelState.UNLOADED
    assert box.router.waiting == [] and box.router.models["B"].loads == 1
    box.ask("A", rid="a3")  # and A goes on serving at once
    assert box.started == ["a1", "a2", "a3"]


def test_a_model_being_swapped_out_for_another_request_is_not_taken_by_a_refused_one() -> None:
    """A is busy and reserved (draining) for a request for C; requests for the broken B within
    its backoff change nothing: A still goes to C once its work ends, B is not loaded."""
    box = Broken(["A", "B", "C"], broken={"B"}, max_loaded_models=1)
    box.ask("B", rid="b1")
    box.load_ends("B")
    box.ask("A", rid="a1")
    box.ask("C", rid="c1")
    assert box.state("A") is ModelState.DRAINING
    for _ in range(3):
        assert box.try_("B", rid=None) is None
    assert box.state("A") is ModelState.DRAINING and box.state("B") is ModelState.UNLOADED
    box.finish("a1")
    assert box.started == ["a1", "c1"] and box.state("C") is ModelState.LOADED
    assert box.swaps == [("load", "B"), ("load", "A"), ("unload", "A"), ("load", "C")]


def test_the_backoff_doubles_with_each_failure_in_a_row_up_to_five_minutes() -> None:
    box = Broken(["A", "B"], broken={"B"}, max_loaded_models=1)
    waits = []
    for _ in range(9):
        assert box.try_("B") is not None  # the backoff has passed: this request loads it again
        box.load_ends("B")
        waits.append(round(box.router.backoff_left("B"), 3))
        box.later(waits[-1] - 0.5)
        assert box.try_("B") is None  # half a second early: still refused, nothing loaded
        box.later(0.5)
    assert waits == [5, 10, 20, 40, 80, 160, 300, 300, 300]
    assert box.router.models["B"].loads == 9 and box.swaps.count(("load", "B")) == 9
    snap = box.router.snapshot()["models"]["B"]  # type: ignore[index]
    assert (snap["state"], snap["load_failures"], snap["load_backoff_s"]) == ("unloaded", 9, 0.0)


def test_a_successful_load_resets_the_backoff() -> None:
    """The file was fixed (or the failure was passing): after the next good load, a later failure
    starts again at 5 s, not where the last run of failures left off."""
    box = Broken(["A", "B"], broken={"B"}, max_loaded_models=1)
    for _ in range(3):
        box.try_("B")
        box.load_ends("B")
        box.later(box.router.backoff_left("B"))
    box.broken = set()
    box.ask("B", rid="ok")
    assert box.started == ["ok"] and box.state("B") is ModelState.LOADED
    assert box.router.snapshot()["models"]["B"]["load_failures"] == 0  # type: ignore[index]
    box.finish("ok")
    box.router.request_unload("B")
    box.settle()
    box.broken = {"B"}
    box.try_("B")
    box.load_ends("B")
    assert box.router.backoff_left("B") == 5.0


def test_the_admins_load_bypasses_and_resets_the_backoff() -> None:
    box = Broken(["A", "B"], broken={"B"}, max_loaded_models=1)
    for _ in range(4):
        box.try_("B")
        box.load_ends("B")
        box.later(box.router.backoff_left("B"))
    assert box.try_("B") is not None
    box.load_ends("B")
    assert box.router.backoff_left("B") == 80.0
    box.broken = set()  # the admin replaced the file, and presses Load at once
    box.router.request_load("B")
    box.settle()
    assert box.state("B") is ModelState.LOADED and box.swaps[-1] == ("load", "B")
    assert box.try_("B", rid="b") == "b" and box.started[-1] == "b"
    # a Load that fails again backs off from the start: 5 s, not 160
    box.finish("b")
    box.router.request_unload("B")
    box.settle()
    box.broken = {"B"}
    box.router.request_load("B")
    box.settle()
    box.load_ends("B")
    assert box.router.backoff_left("B") == 5.0


def test_requests_for_other_models_are_not_held_back_and_a_zero_backoff_is_off() -> None:
    box = Broken(["A", "B"], broken={"B"}, max_loaded_models=2)
    box.try_("B")
    box.load_ends("B")
    assert box.try_("A", rid="a") == "a" and box.started == ["a"]
    off = Broken(["A", "B"], broken={"B"}, max_loaded_models=1, load_backoff_s=0)
    off.try_("B")
    off.load_ends("B")
    assert off.router.backoff_left("B") == 0 and off.try_("B", rid="again") == "again" and off.state("B") is ModelState.LOADING
    for bad in ({"load_backoff_s": -1.0}, {"load_backoff_s": float("nan")}, {"load_backoff_s": 10.0, "load_backoff_max_s": 5.0}):
        with pytest.raises(ValueError, match="load_backoff"):
            RouterConfig(**bad)  # type: ignore[arg-type]
