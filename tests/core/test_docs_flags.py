"""docs/configuration.md says it lists every flag, docs/scheduling.md names each rule's test: hold
them to that."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from scheduler.management.commands.serve import Command as Serve

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"


def test_configuration_md_lists_every_serve_flag() -> None:
    parser = argparse.ArgumentParser()
    Serve().add_arguments(parser)
    flags = {s for action in parser._actions for s in action.option_strings if s.startswith("--") and s != "--help"}
    text = DOC.read_text()
    missing = sorted(f for f in flags if f"`{f}" not in text)
    assert missing == []
    assert {"--no-park", "--prefix-cache-slots", "--swap-affinity-bonus"} <= flags


def test_every_test_docs_scheduling_md_names_exists() -> None:
    named = set(re.findall(r"`(test_[a-z0-9_]+)`", (ROOT / "docs" / "scheduling.md").read_text()))
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    defined = set(re.findall(r"def (test_[a-z0-9_]+)", tests))
    assert len(named) > 90 and sorted(named - defined) == []
