"""docs/configuration.md says it lists every flag: hold it to that."""

from __future__ import annotations

import argparse
from pathlib import Path

from scheduler.management.commands.serve import Command as Serve

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_md_lists_every_serve_flag() -> None:
    parser = argparse.ArgumentParser()
    Serve().add_arguments(parser)
    flags = {s for action in parser._actions for s in action.option_strings if s.startswith("--") and s != "--help"}
    text = DOC.read_text()
    missing = sorted(f for f in flags if f"`{f}" not in text)
    assert missing == []
    assert {"--no-park", "--prefix-cache-slots", "--swap-affinity-bonus"} <= flags
