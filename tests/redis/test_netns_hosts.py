"""Redis, a web head and an engine worker on three "hosts": network namespaces joined by veth
pairs on a bridge, each process with its own address, its own hostname (a UTS namespace) and its
own data directory. Nothing may assume one machine: the head is reached on its own address (so
keys are required), the worker and the head find Redis by its URL (with a password, as Redis
refuses non-loopback clients without one), and the fleet shows the worker's host.

Needs root and ``ip netns`` (CAP_SYS_ADMIN, CAP_NET_ADMIN); where they are missing the test is
skipped with the reason ``ip`` gave."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from testkit.harness import ROOT, stop_processes

from .fleet.conftest import MODEL, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.model]

PASSWORD = "fleet-secret"


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def netns_unavailable() -> str | None:
    """Why this machine cannot make network namespaces, or None."""
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"sfprobe{os.getpid()}"
    made = run("ip", "netns", "add", probe)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    try:
        bridge = run("ip", "link", "add", probe, "type", "bridge")
        if bridge.returncode != 0:
            return f"ip link add type bridge failed: {bridge.stderr.strip()}"
        run("ip", "link", "del", probe)
    finally:
        run("ip", "netns", "del", probe)
    return None


@dataclass
class Hosts:
    tag: str
    subnet: str  # "10.N.0"
    names: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"sfbr{self.tag}"

    def add(self, role: str, last_octet: int) -> str:
        """A host: a namespace with loopback and one veth end on the bridge."""
        ns, outer, inner = f"sf{role}{self.tag}", f"sf{role[0]}{self.tag}h", f"sf{role[0]}{self.tag}n"
        for argv in (
            ["ip", "netns", "add", ns],
            ["ip", "link", "add", outer, "type", "veth", "peer", "name", inner],
            ["ip", "link", "set", inner, "netns", ns],
            ["ip", "link", "set", outer, "master", self.bridge],
            ["ip", "link", "set", outer, "up"],
            ["ip", "-n", ns, "addr", "add", f"{self.subnet}.{last_octet}/24", "dev", inner],
            ["ip", "-n", ns, "link", "set", inner, "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
        ):
            done = run(*argv)
            assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"
        self.names.append(ns)
        return ns

    def spawn(self, ns: str, hostname: str, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        """``argv`` in namespace ``ns`` under its own hostname."""
        script = f"hostname {hostname} && exec \"$@\""
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", script, "sh", *argv],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )
        self.procs.append(proc)
        return proc


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    reason = netns_unavailable()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable here: {reason}")
    tag = uuid.uuid4().hex[:4]
    h = Hosts(tag, f"10.{200 + int(tag[:2], 16) % 50}.0")
    made = run("ip", "link", "add", h.bridge, "type", "bridge")
    assert made.returncode == 0, made.stderr
    try:
        run("ip", "link", "set", h.bridge, "up")
        run("ip", "addr", "add", f"{h.subnet}.254/24", "dev", h.bridge)  # the test's own address
        yield h
    finally:
        stop_processes(*h.procs)
        for ns in h.names:
            run("ip", "netns", "del", ns)
        run("ip", "link", "del", h.bridge)  # the veth ends on it go with their namespaces


def test_redis_a_head_and_a_worker_on_three_hosts_serve_together(hosts: Hosts) -> None:
    redis_ns, head_ns, worker_ns = hosts.add("redis", 1), hosts.add("head", 2), hosts.add("work", 3)
    redis_ip, head_ip = f"{hosts.subnet}.1", f"{hosts.subnet}.2"
    logs = Path(tempfile.mkdtemp(prefix="superfluid-netns-"))
    url = f"redis://:{PASSWORD}@{redis_ip}:6379/0"
    hosts.spawn(
        redis_ns, "sf-redis-host",
        ["redis-server", "--bind", redis_ip, "--port", "6379", "--requirepass", PASSWORD, "--save", "", "--appendonly", "no", "--dir", str(logs)],
        dict(os.environ), logs / "redis.log",
    )
    # each host its own data directory: the head's database, the worker's nothing shared
    head_dir, worker_dir = tempfile.mkdtemp(prefix="sf-head-"), tempfile.mkdtemp(prefix="sf-worker-")
    head_env = {**os.environ, "SUPERFLUID_DATA_DIR": head_dir, "REDIS_URL": url}
    subprocess.run([sys.executable, str(ROOT / "manage.py"), "migrate", "-v", "0"], cwd=ROOT, env=head_env, check=True, timeout=300)
    made = subprocess.run([sys.executable, str(ROOT / "manage.py"), "createkey", "netns", "--admin"], cwd=ROOT, env=head_env, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    secret = made.stdout.strip().splitlines()[-1]

    worker_env = {**os.environ, "SUPERFLUID_DATA_DIR": worker_dir, "REDIS_URL": url}
    worker_argv = [sys.executable, str(ROOT / "manage.py"), "runengine", "--max-batch", "2", "--ctx-size", "1024", "--threads", "1"]
    hosts.spawn(worker_ns, "sf-worker-host", worker_argv, worker_env, logs / "worker.log")
    head_argv = [sys.executable, str(ROOT / "manage.py"), "serve", "--no-engine", "--host", head_ip, "--port", "8000"]
    head = hosts.spawn(head_ns, "sf-head-host", head_argv, head_env, logs / "head.log")

    base = f"http://{head_ip}:8000"
    auth = {"authorization": f"Bearer {secret}"}

    def answer() -> httpx.Response | None:
        assert head.poll() is None, (logs / "head.log").read_text()
        try:
            r = httpx.post(base + "/v1/completions", json={"model": MODEL, "prompt": "The sky is", "max_tokens": 6, "temperature": 0}, headers=auth, timeout=120)
        except httpx.HTTPError:
            return None
        return r if r.status_code == 200 else None

    r = wait_until(answer, 300, "the head on its host answers through the worker on another")
    assert r.json()["usage"]["completion_tokens"] == 6
    assert httpx.post(base + "/v1/completions", json={"model": MODEL, "prompt": "x"}, timeout=30).status_code == 401  # beyond loopback

    state = httpx.get(base + "/v1/internal/state", headers=auth, timeout=10).json()
    assert [w["host"] for w in state.get("fleet", [])] == ["sf-worker-host"], state  # the worker's host, not the head's
    assert state["fleet"][0]["worker"].startswith("sf-worker-host:")
    metrics = httpx.get(base + "/metrics", headers=auth, timeout=10).text
    assert re.search(r'^superfluid_fleet_lanes\{[^}]*host="sf-worker-host"', metrics, re.M), metrics
