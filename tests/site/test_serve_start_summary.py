"""The end-of-run list of real servers (tests/conftest.py): a ``serve`` started on the data
directory of an earlier one that had exited is listed as that server's restart, so the list tells
a second server configuration from the same server started again (issue 16 read the fault tests'
restart as a second fault server)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests import conftest


def start(data_dir: Path, code: str = "") -> conftest._ServeStart:
    """A stand-in child whose command line reads as ``manage.py serve`` (python -c ignores the
    words after its code): counted as serve starts are, in a list of this test's own."""
    conftest._CountingPopen([sys.executable, "-c", code, "manage.py", "serve"], env={"SUPERFLUID_DATA_DIR": str(data_dir)})
    return conftest._serve_starts[-1]


def test_a_serve_started_again_on_an_exited_ones_database_is_listed_as_its_restart(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(conftest, "_serve_starts", [])
    monkeypatch.delenv("SUPERFLUID_TEST_SERVE_LOG", raising=False)  # the run's own list of starts
    first = start(tmp_path / "a")
    first.proc.wait()
    other = start(tmp_path / "b", "import time; time.sleep(60)")  # running: a head beside it is no restart
    try:
        again = start(tmp_path / "a")
        beside = start(tmp_path / "b")
        for s in (again, beside):
            s.proc.wait()
    finally:
        other.proc.kill()
        other.proc.wait()
    assert first.restart_of is None and other.restart_of is None and beside.restart_of is None
    assert again.restart_of == first.test
    assert conftest._serve_line(again).endswith(f"(a restart of the server {first.test} started, on its database)")
    assert "(a restart" not in conftest._serve_line(beside)
