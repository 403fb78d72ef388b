"""Nobody but the serving user can reach the link: no path in a shared directory, no other uid."""

from __future__ import annotations

import os
import queue
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from scheduler.link.messages import Hello, decode
from scheduler.worker.server import LinkServer

NOBODY = 65534


def serve_at(path: Path) -> LinkServer:
    server = LinkServer(queue.SimpleQueue(), hello=lambda: Hello("sim", "sim", 1, 64, os.getpid()), path=str(path))
    server.start()
    return server


def test_the_worker_will_not_listen_in_a_directory_others_can_write(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    with pytest.raises(ValueError, match="writable by no one else"):
        serve_at(shared / "engine.sock")
    assert not (shared / "engine.sock").exists()


def test_the_socket_is_the_owners_alone_and_removed_on_close(tmp_path: Path) -> None:
    server = serve_at(tmp_path / "engine.sock")
    try:
        assert stat.S_IMODE(os.stat(tmp_path / "engine.sock").st_mode) == 0o600
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(tmp_path / "engine.sock"))
            s.settimeout(5)
            assert isinstance(decode(s.makefile("rb").readline()), Hello)
    finally:
        server.close()
    assert not (tmp_path / "engine.sock").exists()


def test_a_second_worker_on_a_socket_a_live_worker_listens_on_is_refused_and_a_stale_one_is_replaced(tmp_path: Path) -> None:
    """The second of two runengines given one --socket unlinked the first's socket and bound its
    own: two workers with a model each, and serve's link talking to whichever it reached."""
    path = tmp_path / "engine.sock"
    first = serve_at(path)
    try:
        with pytest.raises(ValueError, match="already listening"):
            serve_at(path)
        with socket.socket(socket.AF_UNIX) as s:  # the first still has its name
            s.connect(str(path))
            s.settimeout(5)
            assert isinstance(decode(s.makefile("rb").readline()), Hello)
    finally:
        first.close()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # a worker that died without removing its socket file
    stale.close()
    serve_at(path).close()


CONNECT = """
import os, socket, sys
if len(sys.argv) > 2:
    os.setgid(int(sys.argv[2]))
    os.setuid(int(sys.argv[2]))  # started as root, this child is now another user
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print("refused", exc.errno)
    raise SystemExit
s.settimeout(5)
print("got", repr(s.recv(4096)))
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a child as another user")
def test_a_connection_from_another_uid_is_refused_even_when_the_file_lets_it_in() -> None:
    directory = Path(tempfile.mkdtemp(prefix="superfluid-link-test-", dir="/tmp"))
    directory.chmod(0o755)  # others may enter, not write: the worker accepts it
    path = directory / "engine.sock"
    server = serve_at(path)
    try:
        os.chmod(path, 0o666)  # only the peer check stands in the way now
        other = subprocess.run([sys.executable, "-c", CONNECT, str(path), str(NOBODY)], capture_output=True, text=True, timeout=30)
        assert other.stdout.strip() == "got b''", other.stdout + other.stderr  # closed, never greeted
        same = subprocess.run([sys.executable, "-c", CONNECT, str(path)], capture_output=True, text=True, timeout=30)
        assert same.stdout.startswith("got b'{\"type\":\"hello\""), same.stdout + same.stderr
    finally:
        server.close()
        shutil.rmtree(directory)


def test_a_fresh_data_directory_is_private_and_the_secret_key_too(tmp_path: Path) -> None:
    data = tmp_path / "a" / "data"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SECRET_KEY"}
    env.update(SUPERFLUID_DATA_DIR=str(data), DJANGO_SETTINGS_MODULE="superfluid_site.settings")
    code = "from django.conf import settings; print(len(settings.SECRET_KEY))"
    root = Path(__file__).resolve().parents[2]
    for _ in range(2):  # made, then read back unchanged
        out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and int(out.stdout) >= 50, out.stderr
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(data / "secret_key").st_mode) == 0o600
    assert sorted(p.name for p in data.iterdir()) == ["secret_key"]
