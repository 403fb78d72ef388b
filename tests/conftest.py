"""Fixtures shared by the engine and end-to-end tests."""

from __future__ import annotations

import gc
import os
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

# Every real server the run starts: one ``manage.py serve`` child process, whoever starts it (the
# harness's RunningServer, a fleet test's own Popen, a test that expects the start to fail).
# (test that started it, whether it loads a model); listed at the end of the run.
_serve_starts: list[tuple[str, bool]] = []


def _is_serve(argv: Any) -> bool:
    if isinstance(argv, (str, bytes)) or not isinstance(argv, (list, tuple)):
        return False
    words = [os.fsdecode(a) for a in argv]
    return any(w.endswith("manage.py") and words[i + 1 : i + 2] == ["serve"] for i, w in enumerate(words))


class _CountingPopen(subprocess.Popen):  # type: ignore[type-arg]
    def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
        if _is_serve(args):
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
            _serve_starts.append((test, "--no-engine" not in [os.fsdecode(a) for a in args]))
        super().__init__(args, *rest, **kwargs)


subprocess.Popen = _CountingPopen  # type: ignore[misc]


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
    if _serve_starts:
        with_model = sum(1 for _, model in _serve_starts if model)
        terminalreporter.section("real servers started (manage.py serve)")
        terminalreporter.write_line(f"{len(_serve_starts)} started: {with_model} loading a model, {len(_serve_starts) - with_model} --no-engine heads")
        for test, model in _serve_starts:
            terminalreporter.write_line(f"  {'model    ' if model else 'no-engine'} {test}")
    if _leaks:
        terminalreporter.section("resources left open (collected at each test's end)")
        for line in _leaks:
            terminalreporter.write_line(line)
