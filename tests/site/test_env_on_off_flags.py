"""serve's on/off flags read their variables by the documented boolean rules (docs/configuration.md:
"Booleans read 1/true/yes/on and 0/false/no/off (any case) ... Any other value stops the process
with the variable's name"); SUPERFLUID_NO_REPACK=1 beside SUPERFLUID_REPACK=on is refused."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from django.core.management.base import CommandError


def serve_defaults() -> dict[str, Any]:
    from scheduler.management.commands.serve import Command as Serve

    parser = argparse.ArgumentParser()
    Serve().add_arguments(parser)
    return vars(parser.parse_args([]))


@pytest.mark.parametrize("flag", ["os_pressure", "adapt_threads"])
@pytest.mark.parametrize(("raw", "expected"), [("off", "off"), ("OFF", "off"), ("0", "off"), ("false", "off"), ("No", "off"), ("ON", "on"), ("1", "on"), ("yes", "on")])
def test_an_on_off_flags_variable_reads_every_documented_boolean_spelling(monkeypatch: pytest.MonkeyPatch, flag: str, raw: str, expected: str) -> None:
    """SUPERFLUID_OS_PRESSURE=0 (or OFF) stopped serve with "--os-pressure must be on or off",
    a line that does not name the variable that was wrong, for a value the docs accept."""
    from scheduler.management.options import scheduler_config

    monkeypatch.setenv("SUPERFLUID_" + flag.upper(), raw)
    options = serve_defaults()
    assert options[flag] == expected
    scheduler_config(options)  # and it is valid


@pytest.mark.parametrize("flag", ["os_pressure", "adapt_threads"])
def test_an_on_off_flags_bad_variable_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, flag: str) -> None:
    monkeypatch.setenv("SUPERFLUID_" + flag.upper(), "maybe")
    with pytest.raises(CommandError, match=f"SUPERFLUID_{flag.upper()}='maybe'"):
        serve_defaults()


def test_the_repack_variable_reads_its_modes_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUPERFLUID_REPACK", "OFF")
    assert serve_defaults()["repack"] == "off"


def test_no_repack_beside_repack_on_is_refused_not_silently_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """SUPERFLUID_NO_REPACK=1 with SUPERFLUID_REPACK=on started with the extra buffer types on
    (where they crash, with AMX) without a word: the two variables contradict each other."""
    monkeypatch.setenv("SUPERFLUID_NO_REPACK", "1")
    monkeypatch.setenv("SUPERFLUID_REPACK", "on")
    with pytest.raises(CommandError, match="SUPERFLUID_NO_REPACK"):
        serve_defaults()
    monkeypatch.setenv("SUPERFLUID_REPACK", "off")  # agreeing: fine
    assert serve_defaults()["repack"] == "off"


def test_the_event_loop_variable_reads_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """SUPERFLUID_LOG_LEVEL reads in any case; SUPERFLUID_EVENT_LOOP=Asyncio stopped serve."""
    import asyncio

    from superfluid_site.eventloop import use_event_loop

    monkeypatch.setenv("SUPERFLUID_EVENT_LOOP", "Asyncio")
    policy = asyncio.get_event_loop_policy()
    try:
        assert use_event_loop() == "asyncio"
    finally:
        asyncio.set_event_loop_policy(policy)


def test_a_bad_serving_flags_variable_stops_serve_with_one_line_not_a_traceback(tmp_path: Any) -> None:
    """`SUPERFLUID_PREFILL_BUDGET=x python manage.py serve` (a variable only serve's flags read,
    not the settings) printed a 20-line traceback ending in the CommandError."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "SUPERFLUID_DATA_DIR": str(tmp_path), "SUPERFLUID_PREFILL_BUDGET": "x"}
    out = subprocess.run([sys.executable, "manage.py", "serve", "--help"], env=env, cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip() == "serve: environment value for --prefill-budget: SUPERFLUID_PREFILL_BUDGET='x' is not an integer"
