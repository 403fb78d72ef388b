"""Fixtures shared by the engine and end-to-end tests."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def mlx_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled SmolLM2 GGUF converted to an MLX model folder, once per session: the
    conversion is part of what the MLX tests test, never a checked-in artefact. mlx, mlx-lm and
    tokenizers are in requirements.txt: a missing one fails these tests, it does not skip them."""
    from scheduler.engines.mlx_convert import convert_gguf
    from scheduler.engines.models import default_model_path

    return convert_gguf(default_model_path(), tmp_path_factory.mktemp("mlx") / "SmolLM2-135M-Instruct-mlx")


_leaks: list[str] = []


@pytest.fixture(autouse=True)
def _collect_each_tests_garbage(request: pytest.FixtureRequest) -> Iterator[None]:
    """Collect each test's garbage when it ends. A client, socket or connection a test dropped
    without closing is then finalised here, and listed at the end of the run, instead of
    raising its ResourceWarning inside whichever later test the garbage collector happens to
    run in (warnings are errors here: CI once failed a Redis test on a connection leaked
    earlier). Whether an unclosed client is garbage by a test's end depends on reference cycles,
    so a leak is reported, not failed, to keep the suite deterministic."""
    yield
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    leaks = sorted({str(w.message) for w in caught if issubclass(w.category, ResourceWarning)})
    if leaks:
        _leaks.append(f"{request.node.nodeid}: " + "; ".join(leaks[:3]))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _leaks:
        terminalreporter.section("resources left open (collected at each test's end)")
        for line in _leaks:
            terminalreporter.write_line(line)
