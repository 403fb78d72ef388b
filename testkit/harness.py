"""Start the real server (manage.py serve, real model) on a free port: for the e2e tests and the benchmarks."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
# Debian's chromium, headless, for the dashboard's browser tests and bench/dashboard_shot.py
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def stop_processes(*procs: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGTERM to each child still running, then wait for each; one still there after
    ``timeout_s`` is killed (and reaped)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A server child process on 127.0.0.1:``port``, its output in ``log_path``, healthy once
    ``GET /health`` answers 200. Shared by ``RunningServer`` and the benchmark peers."""

    name = "server"

    def __init__(self, port: int, log_path: Path, env: dict[str, str], cwd: Path | None = None) -> None:
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def _launch(self, argv: list[str], timeout_s: float) -> None:
        """Start ``argv`` with its output in the log, then wait until /health is 200."""
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} did not become healthy in {timeout_s:.0f} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self) -> dict:
        return httpx.get(self.base + "/health", timeout=5).json()

    def wait_for(self, predicate, timeout_s: float = 10.0, interval_s: float = 0.05):  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(interval_s)
        raise AssertionError("condition not met in time")

    def stop(self) -> int:
        """SIGTERM, up to 60 s to exit, then SIGKILL; returns the exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


DATA_DIRS: list[str] = []  # every RunningServer's data directory, for remove_data_dirs()


def remove_data_dirs() -> None:
    """Delete the data directories (database, logs) of every server started so far; the test
    run does it when it passed, and keeps them, logs and all, when it did not."""
    while DATA_DIRS:
        shutil.rmtree(DATA_DIRS.pop(), ignore_errors=True)


class RunningServer(ServerProcess):
    """``manage.py serve`` with ``flags``, a fresh data directory and a free port."""

    name = "server"

    def __init__(self, *flags: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = tempfile.mkdtemp(prefix="superfluid-test-")
        DATA_DIRS.append(self.data_dir)
        self.flags = flags
        super().__init__(
            free_port(),
            Path(self.data_dir) / "serve.log",
            {**os.environ, "SUPERFLUID_DATA_DIR": self.data_dir, **(env or {})},
            cwd=ROOT,
        )

    def start(self, timeout_s: float = 120.0) -> RunningServer:
        self._launch([sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(self.port), *self.flags], timeout_s)
        # /health is ok once the worker said hello; its first snapshot (what /v1/internal/state
        # serves, 503 until then) follows within a tick, later on a busy machine. Under
        # --require-key the endpoint answers 401 without a key, and the wait ends at once.
        self.wait_for(self._has_state, timeout_s=60)
        return self

    def _has_state(self) -> bool:
        try:
            return httpx.get(self.base + "/v1/internal/state", timeout=5).status_code != 503
        except httpx.HTTPError:
            return False

    def state(self) -> dict:
        return httpx.get(self.base + "/v1/internal/state", timeout=5).json()

    def manage(self, *args: str, env: dict[str, str] | None = None) -> str:
        """``manage.py ARGS`` against this server's data directory (its database); its output."""
        done = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} exited with {done.returncode}:\n{done.stdout}{done.stderr}")
        return done.stdout


def create_superuser(server: RunningServer, user: str, password: str) -> None:
    """An admin account in ``server``'s database (for a browser to log in as)."""
    env = {**server.env, "DJANGO_SUPERUSER_USERNAME": user, "DJANGO_SUPERUSER_PASSWORD": password, "DJANGO_SUPERUSER_EMAIL": "ops@example.invalid"}
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "createsuperuser", "--noinput"], env=env, cwd=ROOT, check=True, capture_output=True)


def admin_page(browser: Any, base: str, user: str, password: str, next_path: str = "/dashboard/") -> Any:
    """A new page of ``browser`` (playwright), logged in through the admin's form, on ``next_path``."""
    page = browser.new_page(viewport={"width": 1440, "height": 1100})
    page.goto(f"{base}/admin/login/?next={next_path}")
    page.fill("#id_username", user)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{next_path}")
    return page
