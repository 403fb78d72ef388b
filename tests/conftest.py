"""Fixtures shared by the engine and end-to-end tests."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# The one shared real server: the bundled SmolLM2 model, four lanes (enough for n=4 choices and
# for a test to fill every lane), and request bounds small enough for the slow-client tests to
# reach them. Tests on it assert on deltas (a counter read before and after), on their own
# requests' ids, never on totals: other tests used it before them.
SHARED_SERVER_FLAGS = ("--max-batch", "4", "--ctx-size", "2048", "--body-timeout", "3", "--max-body-bytes", "100000")


@pytest.fixture(scope="session")
def shared_server() -> Iterator[Any]:
    """The real server most end-to-end tests share; tests that kill, drain or need other flags
    start their own (the summary at the end of the run lists every start)."""
    from testkit.harness import RunningServer

    srv = RunningServer(*SHARED_SERVER_FLAGS).start()
    try:
        yield srv
    finally:
        srv.stop()


# The one keyed real server: --require-key, a completion rate the keys tests reach on purpose,
# a static key from the environment (a container's SUPERFLUID_API_KEY), and bound to 127.0.0.2
# (loopback, but not in the default DJANGO_ALLOWED_HOSTS: the deployment test's --host). The
# tests on it make keys of their own names in its database.
KEYED_SERVER_HOST = "127.0.0.2"
KEYED_SERVER_STATIC_KEY = "sf-container-static-key-0123456789"
KEYED_SERVER_FLAGS = (
    "--host", KEYED_SERVER_HOST, "--require-key", "--max-batch", "4", "--ctx-size", "1024", "--completion-rate", "1/m", "--completion-burst", "2",
)  # fmt: skip


@pytest.fixture(scope="session")
def keyed_server() -> Iterator[Any]:
    """The real server the --require-key tests share (tests/keys/test_e2e_keys.py,
    tests/keys/test_e2e_deploy.py, tests/e2e/test_batches_keys.py)."""
    from testkit.harness import RunningServer

    srv = RunningServer(*KEYED_SERVER_FLAGS, env={"SUPERFLUID_API_KEY": KEYED_SERVER_STATIC_KEY})
    srv.base = f"http://{KEYED_SERVER_HOST}:{srv.port}"
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


# The one several-models real server (serve --config, and --fim-model): the bundled SmolLM2 as
# ``smol`` and Gemma 3 270M as ``gemma``, one lane of 1024 tokens each, one loaded at a time, Gemma
# unloaded once idle for this long, and the request-priority seed's serial router with a swap
# affinity bonus of 10; beside them the bundled GGUF again as the FIM model, under its file name
# (with_fim_model), two lanes of 2048 tokens, pinned: resident from the start, in no swap slot,
# never a victim. Which of smol and gemma is loaded when a test starts depends on the tests before
# it (or neither: gemma's TTL): a test that needs one asks for it.
MODELS_SERVER_GEMMA_TTL_S = 3


@pytest.fixture(scope="session")
def models_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real server the router tests (tests/e2e/test_models.py, test_two_models.py), the FIM
    tests (tests/e2e/test_fim_model.py), the dashboard's models test and the one-lane preemption
    test share."""
    from scheduler.engines.models import default_model_path, gemma_model_path
    from testkit.configs import two_models_config
    from testkit.harness import RunningServer

    path = tmp_path_factory.mktemp("models") / "superfluid.yaml"
    path.write_text(two_models_config(default_model_path(), gemma_model_path(), max_batch=1, gemma_ttl_s=MODELS_SERVER_GEMMA_TTL_S, swap_affinity_bonus=10))
    srv = RunningServer("--config", str(path), "--fim-model", str(default_model_path()), "--fim-max-context", "2048").start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def mlx_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled SmolLM2 GGUF converted to an MLX model folder, once per session: the
    conversion is part of what the MLX tests test, never a checked-in artefact. mlx, mlx-lm and
    tokenizers are in requirements.txt: a missing one fails these tests, it does not skip them."""
    from scheduler.engines.mlx_convert import convert_gguf
    from scheduler.engines.models import default_model_path

    return convert_gguf(default_model_path(), tmp_path_factory.mktemp("mlx") / "SmolLM2-135M-Instruct-mlx")


@pytest.fixture(scope="session")
def mlx_float_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same conversion with every weight dequantised to float32 (``mlxconvert --dtype
    float32``): what the MLX engine's tests serve. MLX's CPU backend multiplies float weights
    through BLAS (OpenBLAS when installed: scheduler/engines/mlx_runtime.py) and quantised ones
    through a kernel of its own that is many times slower on these machines; the quantised
    folder is served by the engine in tests/engines/test_mlx_convert.py."""
    from scheduler.engines.mlx_convert import convert_gguf
    from scheduler.engines.models import default_model_path

    folder = tmp_path_factory.mktemp("mlx-float32") / "SmolLM2-135M-Instruct-mlx"
    return convert_gguf(default_model_path(), folder, dtype="float32")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The test database is a SQLite file, as the served one is, not Django's default in-memory
    database. That one is shared between a process's connections through SQLite's shared cache,
    where two connections that meet on a table get "database table is locked" at once: the
    busy timeout (settings.SQLITE_OPTIONS) does not apply there. A test whose thread polls a
    table while the batch runner's thread writes to it failed on that, never on a real server.
    On a file, the two wait for each other as they do in production. (pytest-django calls this
    fixture before it creates the test database; it mutates the dict the connections read.)"""
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):  # on PostgreSQL (DATABASE_URL: tests/site/test_postgresql.py) Django's test database
        db.setdefault("TEST", {})["NAME"] = str(tmp_path_factory.mktemp("db") / "test.sqlite3")
        # Commits not synced to the disk (the file is thrown away with the run): each one waited
        # ~15 ms for ext4 here, two at least a transactional test (its database emptied, the
        # post_migrate rows put back). How two connections wait for each other is the same.
        db["OPTIONS"] = {**db.get("OPTIONS", {}), "init_command": "PRAGMA synchronous=OFF"}


def _post_migrate_rows_restored() -> Any:
    """flush's ``emit_post_migrate_signal``, for the test database emptied after every
    ``django_db(transaction=True)`` test: the first time, the signal itself (Django's handlers
    write every content type and permission again, ~17 commits and ~100 queries: 60-80 ms a
    test alone, ~250 ms on a loaded machine, most of the in-process layers' 138 s of teardowns
    in one run); after that, the rows those handlers wrote are put back as they were, in one
    transaction. The database a test starts with is the same (the same rows, ids included: tests
    that give a staff user a permission look it up there). Only while the handlers connected to
    the signal are Django's two whose rows are kept; with any other, each flush sends the signal
    as Django does (tests/site/test_test_run_shortcuts.py)."""
    kept: dict[str, list[tuple[Any, list[dict[str, Any]]]]] = {}

    def emit(verbosity: int, interactive: bool, db: str, **kwargs: Any) -> None:
        import weakref

        from django.contrib.auth.management import create_permissions
        from django.contrib.auth.models import Permission
        from django.contrib.contenttypes.management import create_contenttypes
        from django.contrib.contenttypes.models import ContentType
        from django.core.management import sql
        from django.db import transaction
        from django.db.models.signals import post_migrate

        handlers = {ref() if isinstance(ref, weakref.ReferenceType) else ref for _key, ref, *_ in post_migrate.receivers}
        if handlers != {create_permissions, create_contenttypes} or kwargs:
            sql.emit_post_migrate_signal(verbosity, interactive, db, **kwargs)
            return
        if db not in kept:
            sql.emit_post_migrate_signal(verbosity, interactive, db)
            kept[db] = [(model, list(model._base_manager.using(db).values())) for model in (ContentType, Permission)]
            return
        ContentType.objects.clear_cache()  # as create_contenttypes does
        with transaction.atomic(using=db):
            for model, rows in kept[db]:
                model._base_manager.using(db).bulk_create([model(**row) for row in rows])

    return emit


@pytest.fixture(scope="session", autouse=True)
def _flush_restores_post_migrate_rows() -> Iterator[None]:
    """flush (pytest-django's teardown of a transactional test) with :func:`_post_migrate_rows_restored`."""
    from django.core.management.commands import flush

    real = flush.emit_post_migrate_signal
    flush.emit_post_migrate_signal = _post_migrate_rows_restored()
    try:
        yield
    finally:
        flush.emit_post_migrate_signal = real


FAST_PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(scope="session", autouse=True)
def _fast_password_hashing() -> Iterator[None]:
    """Passwords hashed with MD5 in this process, not PBKDF2's million rounds (~0.4 s a hash
    here): every admin test's user (pytest-django's admin_user, create_superuser) paid that at
    setup, and a login as much again. No test here is about the hash; the served setting is
    Django's default (tests/site/test_test_run_shortcuts.py), and a server the tests start is
    another process, which hashes as served."""
    from django.test import override_settings

    with override_settings(PASSWORD_HASHERS=FAST_PASSWORD_HASHERS):
        yield


_leaks: list[str] = []


@dataclass
class _ServeStart:
    """One real server the run started: one ``manage.py serve`` child process, whoever starts it
    (the harness's RunningServer, a fleet test's own Popen, a test that expects the start to
    fail). ``restart_of`` is the test that started an earlier serve on the same data directory
    (database) which had exited by then: a restart of that server, as a test that stops a server
    and starts it again on its database makes (not another server configuration)."""

    test: str
    model: bool  # loads a model (not a --no-engine head)
    proc: subprocess.Popen  # type: ignore[type-arg]
    data_dir: str
    restart_of: str | None


# Every real server the run starts, listed at the end of the run with the starts that exited
# with an error status (the tests of a serve that refuses to start) and the restarts.
_serve_starts: list[_ServeStart] = []


def _is_serve(argv: Any) -> bool:
    if isinstance(argv, (str, bytes)) or not isinstance(argv, (list, tuple)):
        return False
    words = [os.fsdecode(a) for a in argv]
    return "--help" not in words and any(w.endswith("manage.py") and words[i + 1 : i + 2] == ["serve"] for i, w in enumerate(words))


class _CountingPopen(subprocess.Popen):  # type: ignore[type-arg]
    def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
        super().__init__(args, *rest, **kwargs)
        if _is_serve(args):
            test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
            data_dir = (kwargs.get("env") or os.environ).get("SUPERFLUID_DATA_DIR", "")
            earlier = [s for s in _serve_starts if data_dir and s.data_dir == data_dir and s.proc.poll() is not None]
            start = _ServeStart(test, "--no-engine" not in [os.fsdecode(a) for a in args], self, data_dir, earlier[-1].test if earlier else None)
            _serve_starts.append(start)
            if os.environ.get("SUPERFLUID_TEST_SERVE_LOG"):  # the list as it grows, for a run cut short
                with open(os.environ["SUPERFLUID_TEST_SERVE_LOG"], "a") as log:
                    log.write(f"{_serve_line(start)}\n")


def _serve_line(start: _ServeStart) -> str:
    status = f" (exited {start.proc.returncode})" if (start.proc.returncode or 0) > 0 else ""
    again = f" (a restart of the server {start.restart_of} started, on its database)" if start.restart_of else ""
    return f"{'model    ' if start.model else 'no-engine'} {start.test}{status}{again}"


subprocess.Popen = _CountingPopen  # type: ignore[misc]


@pytest.fixture(autouse=True)
def _activity_written_within_its_test() -> Iterator[None]:
    """Write the activity rows a test queued before its database is emptied. pytest-django's
    database fixture is set up before this one, so it is torn down after: without the wait, a row
    the writer thread had not yet written (a loaded machine, SQLite busy) landed in the next
    test's database, and a test counting rows saw another test's 413 (CI, stop 39)."""
    yield
    writer = sys.modules.get("activity.writer")
    if writer is not None:
        writer.flush()


@pytest.fixture(autouse=True)
def _collect_each_tests_garbage(request: pytest.FixtureRequest) -> Iterator[None]:
    """Collect each test's garbage when it ends. A client, socket or connection a test dropped
    without closing is then finalised here, and listed at the end of the run, instead of
    raising its ResourceWarning inside whichever later test the garbage collector happens to
    run in (warnings are errors here: CI once failed a Redis test on a connection leaked
    earlier). Whether an unclosed client is garbage by a test's end depends on reference cycles,
    so a leak is reported, not failed, to keep the suite deterministic.

    What survives the collection is then frozen (``gc.freeze``): the next test's collection
    walks only the objects made since, not the whole heap of imported libraries (a full
    collection cost ~0.3 s per test here, most of the non-server tests' time). Something frozen
    that becomes cyclic garbage later (a module-scoped fixture's client, say) is never
    collected, so its leak goes unreported: acceptable for a test run."""
    yield
    e2e = sys.modules.get("tests.e2e.server")
    if e2e is not None:
        e2e.close_openai_clients()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        gc.collect()
    gc.freeze()
    leaks = sorted({str(w.message) for w in caught if issubclass(w.category, ResourceWarning)})
    if leaks:
        _leaks.append(f"{request.node.nodeid}: " + "; ".join(leaks[:3]))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int) -> None:
    harness = sys.modules.get("testkit.harness")
    if harness is not None and harness.DATA_DIRS:
        if exitstatus == 0:  # every server's database and log: kept only to read a failure by
            harness.remove_data_dirs()
        else:
            terminalreporter.section("data directories of the servers started (serve.log in each)")
            for path in harness.DATA_DIRS:
                terminalreporter.write_line(f"  {path}")
    if _serve_starts:
        with_model = sum(1 for s in _serve_starts if s.model)
        refused = sum(1 for s in _serve_starts if (s.proc.returncode or 0) > 0)
        restarts = sum(1 for s in _serve_starts if s.restart_of)
        terminalreporter.section("real servers started (manage.py serve)")
        terminalreporter.write_line(
            f"{len(_serve_starts)} started: {with_model} loading a model, {len(_serve_starts) - with_model} --no-engine heads;"
            f" {refused} of them exited with an error status (a test of a serve that must not come up);"
            f" {restarts} of them a restart on an earlier one's database"
        )
        for start in _serve_starts:
            terminalreporter.write_line(f"  {_serve_line(start)}")
    if _leaks:
        terminalreporter.section("resources left open (collected at each test's end)")
        for line in _leaks:
            terminalreporter.write_line(line)
