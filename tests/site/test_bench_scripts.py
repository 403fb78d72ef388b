"""Every benchmark script still imports and parses its flags: ``python bench/X.py --help`` exits 0
(and prints its usage, where the file is a script rather than a helper module such as
bench/peers.py). Run as docs/benchmarks.md runs them, from the repository root with no
PYTHONPATH pointing at it, so a script that imports ``bench.`` or ``testkit.`` without putting the
root on ``sys.path`` fails here. Cheap: ``--help`` exits before any model is loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for p in (ROOT / "bench").glob("*.py") if p.name != "__init__.py")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    kept = [p for p in env.pop("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    return env


def test_there_are_scripts() -> None:
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help_runs(script: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(script.relative_to(ROOT)), "--help"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{script.name} --help exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    if '__name__ == "__main__"' in script.read_text(encoding="utf-8"):
        assert "usage:" in done.stdout, f"{script.name} --help printed no usage:\n{done.stdout}\n{done.stderr}"


def test_every_side_of_a_comparison_runs_first_in_turn() -> None:
    """The benchmarks alternate who goes first in each repetition (bench/peers.py: in_turn):
    a side that always ran first would carry the machine's drift into its ratio the same way
    every time."""
    from bench.peers import in_turn

    sides = ["superfluid", "variant", "llama-server"]
    orders = [in_turn(sides, rep) for rep in range(6)]
    assert all(sorted(order) == sorted(sides) for order in orders)  # each repetition runs every side once
    assert [order[0] for order in orders] == sides + sides
    assert in_turn([], 3) == []
