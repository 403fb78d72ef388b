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


def _defined_tests() -> dict[str, set[str]]:
    """Test name -> the files under tests/ that define it (paths relative to the repository)."""
    where: dict[str, set[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        for name in re.findall(r"def (test_[a-z0-9_]+)", path.read_text()):
            where.setdefault(name, set()).add(path.relative_to(ROOT).as_posix())
    return where


def test_every_test_docs_scheduling_md_names_is_in_the_file_it_names() -> None:
    """docs/scheduling.md names each rule's test "in tests/core/ ... unless another folder is
    named": a test outside tests/core/ is named with its file (``path::name``, ``path``: names, or
    the file named in the same paragraph), every file it names exists, and a name given after a
    file (``path::name``, ``path``: names) is defined in that file. A reader looking for a cited
    test in tests/core/ found nothing where the doc named no other folder."""
    text = (ROOT / "docs" / "scheduling.md").read_text()
    where = _defined_tests()
    paths = set(re.findall(r"`(tests/[\w/]+\.py)(?:::[a-z0-9_]+)?`", text))
    assert sorted(p for p in paths if not (ROOT / p).is_file()) == []
    wrong = [(p, n) for p, n in re.findall(r"`(tests/[\w/]+\.py)::(test_[a-z0-9_]+)`", text) if p not in where.get(n, set())]
    for listed in re.finditer(r"`(tests/[\w/]+\.py)`:((?:\s*(?:and\s+)?`test_[a-z0-9_]+`[,;]?)+)", text):
        wrong += [(listed[1], n) for n in re.findall(r"`(test_[a-z0-9_]+)`", listed[2]) if listed[1] not in where.get(n, set())]
    assert wrong == []
    unnamed = []
    # paragraphs, and each list item or numbered rule on its own
    for para in re.split(r"\n\s*\n|\n(?=\s*- )|\n(?=\s*\d+\. )", text):
        for m in re.finditer(r"`(test_[a-z0-9_]+)`", para):
            files = where.get(m[1], set())
            if not any(f.startswith("tests/core/") for f in files) and not any(f in para for f in files):
                unnamed.append((m[1], sorted(files)))
    assert unnamed == []
