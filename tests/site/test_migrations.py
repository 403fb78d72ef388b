"""Every model change has its migration: ``serve`` migrates the database from the files in
``*/migrations/``, so a field added to a model without one would be missing from every database
and its first query a 500."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError


@pytest.mark.django_db
def test_the_models_and_their_migrations_agree() -> None:
    out = io.StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exit:  # --check exits 1 when a migration is missing
        pytest.fail(f"a model change has no migration (makemigrations exited {exit.code}):\n{out.getvalue()}")
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db
def test_a_database_migrated_part_way_through_a_squashed_history_is_refused_by_name() -> None:
    """The squashed migrations' old files are gone: Django would skip the rest of a history the
    database applied in part, silently, and leave the batch tables without their later columns."""
    from django.db import connection
    from django.db.migrations.recorder import MigrationRecorder

    from scheduler.checks import check_squashed_history

    assert check_squashed_history(databases=["default"]) == []  # the test database applied all of it
    MigrationRecorder(connection).migration_qs.filter(app="batches", name__in=["0004_input_file_kept_apart", "0005_line_pending_index"]).delete()
    [error] = check_squashed_history(databases=["default"])
    assert error.id == "superfluid.E005"
    assert "batches.0001_squashed_0005_line_pending_index: not 0004_input_file_kept_apart, 0005_line_pending_index" in error.msg
    out = io.StringIO()
    with pytest.raises(SystemCheckError, match="superfluid.E005"):
        call_command("migrate", stdout=out, skip_checks=False)
