"""manage.py checkengine takes the engine flags as the worker does (runengine), and refuses a bad
``--rounds`` before it loads anything. The engine itself is not loaded: these are its arguments."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError


class Loaded(Exception):
    """Stands in for the engine: checkengine got as far as loading it."""


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    from scheduler.management.commands import checkengine

    seen: list[dict[str, Any]] = []

    def load_engine(kind: str, model: Any, **kwargs: Any) -> Any:
        seen.append(kwargs)
        raise Loaded

    monkeypatch.setattr(checkengine, "load_engine", load_engine)
    return seen


@pytest.mark.parametrize(("flag", "expected"), [("on", True), ("off", False)])
def test_checkengine_times_the_engine_with_the_adapt_threads_flag_given(loads: list[dict[str, Any]], flag: str, expected: bool) -> None:
    """--adapt-threads off was dropped: the engine chose its threads by measurement anyway, so
    the speeds printed were not those of the worker the same flags start."""
    with pytest.raises(Loaded):
        call_command("checkengine", "--adapt-threads", flag)
    assert loads[0].get("adapt_threads", True) is expected


@pytest.mark.parametrize("rounds", ["0", "-3"])
def test_checkengine_refuses_rounds_that_time_nothing(loads: list[dict[str, Any]], rounds: str) -> None:
    """--rounds 0 printed "decode 0.0 tok/s" (and a negative count a negative speed) for an engine
    that decodes fine, after loading the model."""
    with pytest.raises(CommandError, match="--rounds must be at least 1"):
        call_command("checkengine", "--rounds", rounds)
    assert loads == []
