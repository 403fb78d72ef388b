"""The database-backed tests once more on a real PostgreSQL, the database a fleet of heads shares
(docs/operations.md). SQLite lets through what PostgreSQL refuses or changes: a value longer
than its column, U+0000 or a lone surrogate in a jsonb string, an object's key order (jsonb sorts
keys). The Batch API once failed on all three there and never here.

A PostgreSQL server of Debian's (``.ci/run`` and the README's test command install it) is
started for this test in a temporary directory, on a free loopback port, with no durability;
as root it runs as the ``postgres`` user, which the package creates. The tests listed below run
against it in a child pytest (``DATABASE_URL``); Django makes its test database there."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# every test module that uses the database and starts no server of its own
ON_POSTGRESQL = [
    "tests/batches/test_state.py",
    "tests/batches/test_runner_lines.py",
    "tests/batches/test_files_api.py",
    "tests/batches/test_file_content_slices.py",
    "tests/batches/test_odd_ids_and_hosts.py",
    "tests/activity/test_client_address.py",
    "tests/observability/test_activity.py",
    "tests/keys/test_admin.py",
    "tests/keys/test_admin_issuing.py",
    "tests/keys/test_limit_bounds_s51.py",
    "tests/keys/test_cap_form_errors_s51.py",
    "tests/keys/test_commands.py",
    "tests/keys/test_credentials.py",
    "tests/keys/test_policyfile.py",
    "tests/keys/test_saves_racing_on_one_version.py",
    "tests/keys/test_static_key.py",
    "tests/edge/test_middle_layer.py",
    "tests/edge/test_deep_and_odd_json.py",
    "tests/edge/test_request_bounds.py",
    "tests/edge/test_edge_refusals.py",
    "tests/edge/test_fuzz.py",
    "tests/dashboard/test_models_admin.py",
    "tests/dashboard/test_access.py",
    "tests/link/test_asgi.py",
]


def _bindir() -> Path:
    """The newest installed server's programs (Debian keeps them out of PATH)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if found:
        return found[-1].parent
    on_path = shutil.which("postgres")
    if on_path is None:  # CI installs it: a missing server fails this test, it does not skip it
        raise RuntimeError("PostgreSQL's server is not installed (apt-get install postgresql)")
    return Path(on_path).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def postgresql() -> Iterator[str]:
    """A throwaway server; yields its DATABASE_URL."""
    bindir = _bindir()
    home = Path(tempfile.mkdtemp(prefix="superfluid-postgresql-"))  # not under pytest's root-only directory
    data, port = home / "data", _free_port()
    as_user: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root
        import pwd

        user = pwd.getpwnam("postgres")
        os.chown(home, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    server: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run([*as_user, str(bindir / "initdb"), "-D", str(data), "-U", "superfluid", "--auth=trust", "-E", "UTF8"],
                       check=True, capture_output=True, cwd=home)
        server = subprocess.Popen(
            [*as_user, str(bindir / "postgres"), "-D", str(data), "-k", str(home), "-p", str(port), "-F",
             "-c", "listen_addresses=127.0.0.1", "-c", "full_page_writes=off", "-c", "synchronous_commit=off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=home,
        )
        import psycopg

        deadline = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(host="127.0.0.1", port=port, user="superfluid", dbname="postgres", autocommit=True) as conn:
                    conn.execute("CREATE DATABASE superfluid")
                break
            except psycopg.OperationalError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield f"postgres://superfluid@127.0.0.1:{port}/superfluid"
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)


def test_the_database_backed_tests_pass_on_postgresql(postgresql: str) -> None:
    env = {**os.environ, "DATABASE_URL": postgresql}
    # --reuse-db: Django does not drop its test database at the end (threads of the code under
    # test keep connections open, which PostgreSQL's DROP DATABASE refuses); the server goes
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--reuse-db", *ON_POSTGRESQL]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout.splitlines()[-1] and "failed" not in done.stdout.splitlines()[-1], done.stdout[-2000:]
