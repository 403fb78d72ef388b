"""Every model change has its migration: ``serve`` migrates the database from the files in
``*/migrations/``, so a field added to a model without one would be missing from every database
and its first query a 500."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_the_models_and_their_migrations_agree() -> None:
    out = io.StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exit:  # --check exits 1 when a migration is missing
        pytest.fail(f"a model change has no migration (makemigrations exited {exit.code}):\n{out.getvalue()}")
    assert "No changes detected" in out.getvalue()
