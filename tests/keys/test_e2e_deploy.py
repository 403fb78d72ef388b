"""Deployment and key issuing against the real server: a container's SUPERFLUID_API_KEY, the
address --host binds answering, and a secret rotated in the admin reaching the running server."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from testkit.harness import ROOT, RunningServer
from tests.conftest import KEYED_SERVER_HOST, KEYED_SERVER_STATIC_KEY
from tests.e2e.server import openai_client

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"
STATIC = KEYED_SERVER_STATIC_KEY
SECRET = re.compile(r"sf-[A-Za-z0-9_-]{43}")
ADMIN_USER, ADMIN_PASSWORD = "deploy-root", "a-long-test-password-9"  # the keyed server is shared: a name of its own
HOST = KEYED_SERVER_HOST  # loopback, but not in the default DJANGO_ALLOWED_HOSTS


@pytest.fixture(scope="module")
def srv(keyed_server: RunningServer) -> RunningServer:
    """The session's keyed server (tests/conftest.py): serve --host 127.0.0.2 --require-key with
    SUPERFLUID_API_KEY set, as a container runs it."""
    assert keyed_server.base == f"http://{HOST}:{keyed_server.port}" and keyed_server.env["SUPERFLUID_API_KEY"] == STATIC
    return keyed_server


def manage(srv: RunningServer, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env={**srv.env, **(env or {})}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def chat(srv: RunningServer, secret: str) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2, "temperature": 0}
    return httpx.post(srv.base + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {secret}"}, timeout=60)


def eventually(predicate, what: str, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"never: {what}")


def test_the_static_key_is_accepted_and_a_wrong_one_refused_and_it_is_never_logged(srv: RunningServer) -> None:
    client = openai_client(srv.base, STATIC)
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=2, temperature=0)
    assert raw.http_response.status_code == 200 and raw.parse().usage.completion_tokens >= 1
    assert [m.id for m in client.models.list()] == [MODEL]
    for wrong in (STATIC + "x", STATIC[:-1], "sf-container-static-key-0123456788"):
        r = chat(srv, wrong)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai_client(srv.base, "sf-wrong").models.list()
    assert STATIC not in srv.log()


def test_the_address_serve_binds_answers_and_other_hosts_do_not(srv: RunningServer) -> None:
    # the base URL is http://127.0.0.2:PORT, which DJANGO_ALLOWED_HOSTS does not list
    assert httpx.get(srv.base + "/health", timeout=10).status_code == 200
    assert chat(srv, STATIC).status_code == 200
    r = httpx.get(srv.base + "/v1/models", headers={"host": "evil.example", "x-api-key": STATIC}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"
    r = httpx.post(srv.base + "/v1/chat/completions", json={}, headers={"host": "evil.example", "x-api-key": STATIC}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"


@pytest.fixture(scope="module")
def admin(srv: RunningServer) -> Iterator[httpx.Client]:
    manage(srv, "createsuperuser", "--noinput", env={"DJANGO_SUPERUSER_USERNAME": ADMIN_USER, "DJANGO_SUPERUSER_PASSWORD": ADMIN_PASSWORD, "DJANGO_SUPERUSER_EMAIL": "root@example.org"})
    with httpx.Client(base_url=srv.base, timeout=30) as session:
        session.get("/admin/login/")
        r = session.post(
            "/admin/login/?next=/admin/",
            data={"username": ADMIN_USER, "password": ADMIN_PASSWORD, "next": "/admin/", "csrfmiddlewaretoken": session.cookies["csrftoken"]},
        )
        assert r.status_code == 302, r.text[:2000]
        yield session


def test_a_secret_rotated_in_the_admin_reaches_the_running_server_and_usage_shows_on_the_list(srv: RunningServer, admin: httpx.Client) -> None:
    old = manage(srv, "createkey", "rotating").strip().splitlines()[-1]
    eventually(lambda: chat(srv, old).status_code == 200, "the new key works")  # another process: within a poll
    key_id = re.search(r'href="/admin/keys/apikey/(\d+)/change/">rotating<', admin.get("/admin/keys/apikey/").text).group(1)  # type: ignore[union-attr]
    r = admin.post(f"/admin/keys/apikey/{key_id}/rotate/", data={"csrfmiddlewaretoken": admin.cookies["csrftoken"]})
    assert r.status_code == 200
    (new,) = set(SECRET.findall(r.text))
    assert new != old
    eventually(lambda: chat(srv, old).status_code == 401, "the old secret is refused")
    r = chat(srv, new)
    assert r.status_code == 200, r.text
    assert chat(srv, old).json()["error"]["code"] == "invalid_api_key"
    assert "Rotated the secret" in admin.get(f"/admin/keys/apikey/{key_id}/history/").text
    # two requests made it through (one per secret): the key's usage counts both, its history kept
    def requests_cell() -> str:
        page = admin.get("/admin/keys/apikey/").text
        row = re.search(r">rotating</a>.*?</tr>", page, re.S).group(0)  # type: ignore[union-attr]
        return re.search(r'class="field-requests[^"]*">([^<]*)<', row).group(1)  # type: ignore[union-attr]

    eventually(lambda: requests_cell() == "2 / 2", "the usage column counts the key's two requests")
    assert "<svg" in admin.get(f"/admin/keys/apikey/{key_id}/change/").text
