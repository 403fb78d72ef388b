"""Shortcuts the test process takes (tests/conftest.py), and what they must leave as it was.

The test database's flush after each transactional test (_post_migrate_rows_restored): after
the first, it puts back the content types and permissions Django's post_migrate handlers wrote,
in one transaction, instead of running the handlers again. What a test starts with must be what
the handlers write, and a handler of another app must still be run.

The test database's commits not synced to the disk (django_db_modify_db_settings), on SQLite.

Passwords hashed with MD5 (_fast_password_hashing): in this process only; the served setting
is Django's default, PBKDF2."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import global_settings
from django.contrib.auth.hashers import get_hashers
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command, sql
from django.db import connection
from django.db.models.signals import post_migrate
from django.test.utils import CaptureQueriesContext

pytestmark = pytest.mark.django_db(transaction=True)


def flush() -> None:
    """The flush pytest-django's teardown of a transactional test makes."""
    call_command("flush", verbosity=0, interactive=False, database="default", reset_sequences=False, allow_cascade=False, inhibit_post_migrate=False)


def rows() -> tuple[set[tuple[str, str]], set[tuple[str, str, str, str]]]:
    """Every content type and permission, by their natural keys (ids differ between two runs of the handlers)."""
    types = {(t.app_label, t.model) for t in ContentType.objects.all()}
    perms = {(p.content_type.app_label, p.content_type.model, p.codename, p.name) for p in Permission.objects.select_related("content_type")}
    return types, perms


def test_a_flush_leaves_the_rows_the_post_migrate_handlers_write_in_a_few_queries() -> None:
    flush()  # the handlers' rows are kept by the first flush of the run, if none came before
    with CaptureQueriesContext(connection) as queries:
        flush()
    restored = rows()
    assert len(queries) < 40, f"{len(queries)} queries: the post_migrate handlers ran again"  # the handlers: ~100
    ContentType.objects.all().delete()  # (their permissions with them)
    ContentType.objects.clear_cache()
    sql.emit_post_migrate_signal(0, False, "default")
    assert restored == rows() and restored[1], "the flush left other rows than Django's handlers write"
    assert Permission.objects.filter(codename="view_servedmodel").exists()


def test_a_flush_runs_a_post_migrate_handler_of_another_app() -> None:
    seen: list[Any] = []

    def handler(**kwargs: Any) -> None:
        seen.append(kwargs["using"])

    post_migrate.connect(handler)
    try:
        flush()
        flush()
    finally:
        post_migrate.disconnect(handler)
    assert seen and set(seen) == {"default"}
    assert rows()[1], "the handlers' rows are there"


def test_passwords_are_hashed_fast_here_and_as_django_does_when_served() -> None:
    import superfluid_site.settings as served

    assert get_hashers()[0].algorithm == "md5"
    user = User.objects.create_user("someone", password="a password")
    assert user.password.startswith("md5$") and user.check_password("a password") and not user.check_password("another")
    assert getattr(served, "PASSWORD_HASHERS", global_settings.PASSWORD_HASHERS)[0] == "django.contrib.auth.hashers.PBKDF2PasswordHasher"


def test_the_sqlite_test_database_does_not_sync_its_commits() -> None:
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL's test database is the server's (tests/site/test_postgresql.py)")
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA synchronous")
        assert cursor.fetchone() == (0,)
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone() == ("delete",)  # the locking of the served database's default journal
