"""DJANGO_ALLOWED_HOSTS entries Django can never match: a port (``llm.example.com:8443``, Django
compares the Host's name without its port) or a bare IPv6 address (``fd00::1``, a Host header
spells it ``[fd00::1]``) started the server and answered every request with 400 invalid_host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.http.request import split_domain_port, validate_host

from superfluid_site.env import EnvError

ROOT = Path(__file__).resolve().parents[2]


def settings_hosts(listed: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    code = "import json, django; django.setup(); from django.conf import settings as s; print(json.dumps(s.ALLOWED_HOSTS))"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SUPERFLUID_"))}
    env = {**base, "DJANGO_SETTINGS_MODULE": "superfluid_site.settings", "SUPERFLUID_DATA_DIR": str(tmp_path), "DJANGO_ALLOWED_HOSTS": listed}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)


def test_a_bare_ipv6_address_answers_requests_to_it(tmp_path: Path) -> None:
    done = settings_hosts("llm.example.com, fd00::1", tmp_path)
    assert done.returncode == 0, done.stderr
    hosts = json.loads(done.stdout)
    domain, _port = split_domain_port("[fd00::1]:8000")  # what a client sends
    assert validate_host(domain, hosts), hosts
    assert validate_host("llm.example.com", hosts)


@pytest.mark.parametrize("listed", ["llm.example.com:8443", "https://llm.example.com", "llm.example.com/admin", "[fd00::1]:8000"])
def test_an_allowed_host_that_never_matches_stops_the_start_naming_the_variable(tmp_path: Path, listed: str) -> None:
    done = settings_hosts(listed, tmp_path)
    assert done.returncode != 0 and "EnvError" in done.stderr and "DJANGO_ALLOWED_HOSTS" in done.stderr, done.stderr


@pytest.mark.parametrize(
    "listed, expected",
    [
        (["localhost", "127.0.0.1", "[::1]"], ["localhost", "127.0.0.1", "[::1]"]),
        (["*"], ["*"]),
        ([".example.com", "LLM.example.com"], [".example.com", "LLM.example.com"]),
        (["::1", "FD00:0:0::1", "[fd00::2]"], ["[::1]", "[fd00::1]", "[fd00::2]"]),
    ],
)
def test_the_hosts_django_matches_are_kept(listed: list[str], expected: list[str]) -> None:
    from superfluid_site.deploy import allowed_hosts

    assert allowed_hosts("DJANGO_ALLOWED_HOSTS", listed) == expected


def test_a_port_is_refused_by_the_helper() -> None:
    from superfluid_site.deploy import allowed_hosts

    with pytest.raises(EnvError, match="DJANGO_ALLOWED_HOSTS.*port"):
        allowed_hosts("DJANGO_ALLOWED_HOSTS", ["llm.example.com:8443"])
