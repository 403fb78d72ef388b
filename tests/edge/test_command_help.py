"""`manage.py serve --help` and `runengine --help` print every flag (the README sends users there)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.management.commands import runengine, serve

MANAGE_PY = Path(__file__).resolve().parents[2] / "manage.py"


@pytest.mark.parametrize("command", [serve, runengine], ids=["serve", "runengine"])
def test_help_prints_every_flag(command) -> None:  # type: ignore[no-untyped-def]
    name = command.__name__.rsplit(".", 1)[-1]
    parser = command.Command().create_parser("manage.py", name)
    flags = {opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")}
    assert "--pressure-high" in flags and "--drain-timeout" in flags
    done = subprocess.run([sys.executable, str(MANAGE_PY), name, "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    missing = sorted(f for f in flags if f not in done.stdout)
    assert not missing, missing
    assert "occupancy (%)" in done.stdout
