"""Start the real server (manage.py serve, real model) on a free port: for benchmarks and e2e tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RunningServer:
    def __init__(self, *flags: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.data_dir = tempfile.mkdtemp(prefix="superfluid-test-")
        self.log_path = Path(self.data_dir) / "serve.log"
        self.flags = flags
        self.env = {**os.environ, "SUPERFLUID_DATA_DIR": self.data_dir, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 120.0) -> "RunningServer":
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(self.port), *self.flags],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not become healthy:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def state(self) -> dict:
        return httpx.get(self.base + "/v1/internal/state", timeout=5).json()

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
