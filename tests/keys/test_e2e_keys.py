"""Keys, policies and caps end to end: one real server with --require-key, keys made by
``manage.py createkey`` against its database, the admin driven over HTTP like a browser would."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from testkit.harness import ROOT, RunningServer
from tests.e2e.server import openai_client

pytestmark = [pytest.mark.e2e, pytest.mark.model]

MODEL = "SmolLM2-135M-Instruct.Q4_1"
HI = [{"role": "user", "content": "Say hi."}]
SECRET = re.compile(r"sf-[A-Za-z0-9_-]{43}")
ADMIN_USER, ADMIN_PASSWORD = "root", "a-long-test-password-9"

# name -> createkey flags, all made once the server is up
KEYS: dict[str, list[str]] = {
    "basic": ["--class", "agent", "--max-class", "completion"],
    "granted": ["--batch-invariant"],
    "rpm": ["--rpm", "2"],
    "single": ["--max-concurrent", "1"],
    "elsewhere": ["--models", "some-other-model"],
    "doomed": [],
    "fim": [],
    "ops": ["--admin"],
}


@dataclass
class Keyed:
    srv: RunningServer
    keys: dict[str, str] = field(default_factory=dict)  # name -> secret

    def manage(self, *args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT, env={**self.srv.env, **(env or {})}, capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def createkey(self, name: str, *flags: str) -> str:
        secret = self.manage("createkey", name, *flags).strip().splitlines()[-1]
        self.keys[name] = secret
        return secret

    def chat(self, key: str | None, headers: dict[str, str] | None = None, **body: object) -> httpx.Response:
        h = {"authorization": f"Bearer {self.keys[key]}"} if key else {}
        payload = {"model": MODEL, "messages": HI, "max_tokens": 1, "temperature": 0, **body}
        return httpx.post(self.srv.base + "/v1/chat/completions", json=payload, headers={**h, **(headers or {})}, timeout=60)

    def models(self, secret: str) -> httpx.Response:
        return httpx.get(self.srv.base + "/v1/models", headers={"authorization": f"Bearer {secret}"}, timeout=10)

    def state(self) -> dict:
        r = httpx.get(self.srv.base + "/v1/internal/state", headers={"x-api-key": self.keys["ops"]}, timeout=10)
        assert r.status_code == 200, r.text
        return r.json()

    def client(self, secret: str) -> openai.OpenAI:
        return openai_client(self.srv.base, secret)


@pytest.fixture(scope="module")
def keyed(keyed_server: RunningServer) -> Iterator[Keyed]:
    """The session's keyed server (tests/conftest.py: --require-key --completion-rate 1/m
    --completion-burst 2) with this module's keys."""
    srv = keyed_server
    k = Keyed(srv)
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "createkey", name, *flags],
            cwd=ROOT, env=srv.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for name, flags in KEYS.items()
    }
    outputs = {name: proc.communicate(timeout=60)[0] for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, outputs[name]
        k.keys[name] = outputs[name].strip().splitlines()[-1]
    yield k


def error(r: httpx.Response) -> dict:
    return r.json()["error"]


def soon(srv: RunningServer, predicate) -> None:  # type: ignore[no-untyped-def]
    """``predicate`` comes true while the server keeps running: no restart, no reload. The
    timeout is a failsafe, not a measure (how fast a change lands is the key runtime's
    watch interval; latency belongs in bench/, not in a test's pass or fail)."""
    srv.wait_for(predicate, timeout_s=30, interval_s=0.02)


# -- authentication ----------------------------------------------------------------------


def test_a_missing_or_wrong_key_is_401_before_the_body_is_read(keyed: Keyed) -> None:
    base = keyed.srv.base
    for headers in ({}, {"authorization": "Bearer sf-wrong"}, {"x-api-key": "nope"}, {"authorization": f"Basic {keyed.keys['basic']}"}):
        r = httpx.post(base + "/v1/chat/completions", content=b"{not json", headers=headers, timeout=10)
        assert r.status_code == 401, (headers, r.text)
        assert error(r)["type"] == "authentication_error" and error(r)["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(base + "/v1/models", timeout=10).status_code == 401
    assert httpx.get(base + f"/v1/models/{MODEL}", timeout=10).status_code == 401
    assert httpx.get(base + "/health", timeout=10).status_code == 200  # for load balancers
    # a right key with a bad body gets as far as the 400
    r = httpx.post(base + "/v1/chat/completions", content=b"{not json", headers={"x-api-key": keyed.keys["basic"]}, timeout=10)
    assert r.status_code == 400 and error(r)["code"] == "invalid_json"


def test_bearer_through_the_openai_client_and_x_api_key_both_work(keyed: Keyed) -> None:
    c = keyed.client(keyed.keys["basic"])
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=HI, max_tokens=2, temperature=0)
    assert raw.headers["x-superfluid-qos"] == "agent"
    assert raw.parse().usage.completion_tokens >= 1
    assert [m.id for m in c.models.list()] == [MODEL]
    r = httpx.post(
        keyed.srv.base + "/v1/completions",
        json={"model": MODEL, "prompt": "The sky is", "max_tokens": 1},
        headers={"x-api-key": keyed.keys["basic"]},
        timeout=60,
    )
    assert r.status_code == 200 and r.headers["x-superfluid-qos"] == "agent"
    with pytest.raises(openai.AuthenticationError) as err:
        keyed.client("sf-not-a-key").models.list()
    assert err.value.code == "invalid_api_key"


def test_admin_routes_need_a_key_with_the_admin_flag(keyed: Keyed) -> None:
    for path in ("/v1/internal/state", "/slots"):
        assert httpx.get(keyed.srv.base + path, timeout=10).status_code == 401
        r = httpx.get(keyed.srv.base + path, headers={"x-api-key": keyed.keys["basic"]}, timeout=10)
        assert r.status_code == 403 and error(r)["type"] == "permission_error"
        assert httpx.get(keyed.srv.base + path, headers={"x-api-key": keyed.keys["ops"]}, timeout=10).status_code == 200


def test_a_revoked_key_is_refused_without_a_restart(keyed: Keyed) -> None:
    secret = keyed.keys["doomed"]
    assert keyed.models(secret).status_code == 200
    keyed.manage("revokekey", "doomed")
    soon(keyed.srv, lambda: keyed.models(secret).status_code == 401)
    r = keyed.chat("doomed")
    assert r.status_code == 401 and error(r)["code"] == "invalid_api_key" and "revoked" in error(r)["message"]


def test_an_expired_key_is_accepted_until_its_expiry_and_refused_after_it(keyed: Keyed) -> None:
    lifetime_s = 5.0
    before = time.monotonic()
    secret = keyed.createkey("brief", "--expires-days", str(lifetime_s / 86400))
    after = time.monotonic()  # the key expires between before + lifetime and after + lifetime
    keyed.srv.wait_for(lambda: keyed.models(secret).status_code == 200, timeout_s=30)
    # accepted until it expires, never refused before (the lower bound is the key's meaning)
    keyed.srv.wait_for(lambda: keyed.models(secret).status_code == 401, timeout_s=after - before + lifetime_s + 30)
    assert time.monotonic() >= before + lifetime_s
    assert error(keyed.models(secret))["message"] == "This API key has expired."


# -- class, batch-invariant, models -------------------------------------------------------


def test_a_key_may_demote_but_asking_above_its_best_class_is_403(keyed: Keyed) -> None:
    for asked in ("background", "completion"):
        r = keyed.chat("basic", {"x-superfluid-qos": asked})
        assert r.status_code == 200 and r.headers["x-superfluid-qos"] == asked
    r = keyed.chat("basic", {"x-superfluid-qos": "interactive"})
    assert r.status_code == 403 and error(r)["type"] == "permission_error" and error(r)["code"] == "qos_class_forbidden"
    # the priority header is never an error: its band is clamped to the key's best class
    r = keyed.chat("basic", {"x-llamaswap-priority": "interactive"})
    assert r.status_code == 200 and r.headers["x-superfluid-qos"] == "completion"


def test_batch_invariant_is_403_unless_the_key_grants_it(keyed: Keyed) -> None:
    header = {"x-superfluid-batch-invariant": "true"}
    r = keyed.chat("basic", header)
    assert r.status_code == 403 and error(r)["code"] == "batch_invariant_forbidden"
    assert keyed.chat("granted", header).status_code == 200


def test_a_model_the_key_may_not_use_is_403(keyed: Keyed) -> None:
    r = keyed.chat("elsewhere")
    assert r.status_code == 403 and error(r)["code"] == "model_forbidden" and error(r)["param"] == "model"
    assert keyed.models(keyed.keys["elsewhere"]).json()["data"] == []


# -- limits --------------------------------------------------------------------------------


def test_requests_per_minute_past_the_bucket_are_429_with_retry_after(keyed: Keyed) -> None:
    assert [keyed.chat("rpm").status_code for _ in range(2)] == [200, 200]
    r = keyed.chat("rpm")
    assert r.status_code == 429 and error(r)["type"] == "rate_limit_error" and error(r)["code"] == "rate_limit_exceeded"
    assert 1 <= int(r.headers["retry-after"]) <= 30
    with pytest.raises(openai.RateLimitError):
        keyed.client(keyed.keys["rpm"]).chat.completions.create(model=MODEL, messages=HI, max_tokens=1)


def test_max_concurrent_is_429_while_a_stream_is_open_and_free_again_after_it_ends(keyed: Keyed) -> None:
    body = {"model": MODEL, "messages": HI, "max_tokens": 400, "stream": True}
    headers = {"authorization": f"Bearer {keyed.keys['single']}"}
    with httpx.stream("POST", keyed.srv.base + "/v1/chat/completions", json=body, headers=headers, timeout=60) as stream:
        assert stream.status_code == 200
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        r = keyed.chat("single")
        assert r.status_code == 429 and error(r)["code"] == "concurrency_limit_exceeded" and int(r.headers["retry-after"]) >= 1
    keyed.srv.wait_for(lambda: keyed.chat("single").status_code == 200, timeout_s=10, interval_s=0.1)


def test_the_fim_bucket_is_checked_before_the_model_says_it_has_no_fim_tokens(keyed: Keyed) -> None:
    def fim() -> httpx.Response:
        return httpx.post(
            keyed.srv.base + "/v1/completions",
            json={"model": MODEL, "prompt": "def add(a, b):\n    ", "suffix": "\n    return c", "max_tokens": 4},
            headers={"x-api-key": keyed.keys["fim"]},
            timeout=60,
        )

    # SmolLM2 has no FIM tokens: the two requests the burst allows get the worker's 400
    for _ in range(2):
        r = fim()
        assert r.status_code == 400 and error(r)["code"] == "fim_unsupported"
    r = fim()
    assert r.status_code == 429 and error(r)["code"] == "completion_rate_limited" and int(r.headers["retry-after"]) >= 1
    assert keyed.chat("fim").status_code == 200  # other requests from the client are not counted


# -- the admin, as a browser uses it ---------------------------------------------------------


@pytest.fixture(scope="module")
def admin(keyed: Keyed) -> Iterator[httpx.Client]:
    keyed.manage(
        "createsuperuser", "--noinput",
        env={"DJANGO_SUPERUSER_USERNAME": ADMIN_USER, "DJANGO_SUPERUSER_PASSWORD": ADMIN_PASSWORD, "DJANGO_SUPERUSER_EMAIL": "root@example.org"},
    )
    with httpx.Client(base_url=keyed.srv.base, timeout=30) as session:
        session.get("/admin/login/")
        r = session.post(
            "/admin/login/?next=/admin/",
            data={"username": ADMIN_USER, "password": ADMIN_PASSWORD, "next": "/admin/", "csrfmiddlewaretoken": session.cookies["csrftoken"]},
        )
        assert r.status_code == 302 and r.headers["location"] == "/admin/", r.text[:2000]
        yield session


def post_form(session: httpx.Client, path: str, data: dict[str, object]) -> httpx.Response:
    return session.post(path, data={**data, "csrfmiddlewaretoken": session.cookies["csrftoken"]})


POLICY = {"name": "desk", "default_class": "2", "max_class": "1", "rate_limit_rpm": "0", "max_concurrent": "0", "priority_offset": "0", "allowed_models": ""}


def test_a_key_made_in_the_admin_shows_its_secret_once_and_follows_policy_edits_at_once(keyed: Keyed, admin: httpx.Client) -> None:
    r = post_form(admin, "/admin/keys/keypolicy/add/", {**POLICY, "_continue": "1"})
    assert r.status_code == 302, r.text[:2000]
    policy_url = r.headers["location"]  # /admin/keys/keypolicy/<id>/change/
    policy_id = policy_url.rstrip("/").split("/")[-2]

    r = post_form(admin, "/admin/keys/apikey/add/", {"name": "newcomer", "policy": policy_id, "owner": "a new user", "notes": "", "expires_0": "", "expires_1": ""})
    assert r.status_code == 200
    shown = set(SECRET.findall(r.text))
    assert len(shown) == 1
    secret = keyed.keys["newcomer"] = shown.pop()
    change_url = re.search(r'href="(/admin/keys/apikey/\d+/change/)"', r.text).group(1)  # type: ignore[union-attr]
    for url in (change_url, "/admin/keys/apikey/", "/admin/keys/apikey/?q=newcomer"):
        later = admin.get(url)
        assert later.status_code == 200 and secret not in later.text and secret[:8] in later.text

    # a new user calls the API with it, through the openai client
    c = keyed.client(secret)
    first = c.chat.completions.with_raw_response.create(model=MODEL, messages=HI, max_tokens=1)
    assert first.headers["x-superfluid-qos"] == "agent"

    # the admin moves the policy to background; the next request runs there
    r = post_form(admin, policy_url, {**POLICY, "default_class": "3"})
    assert r.status_code == 302, r.text[:2000]
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=HI, max_tokens=1)
    assert raw.headers["x-superfluid-qos"] == "background"

    # and revokes the key with the list's action: refused from then on
    key_id = change_url.rstrip("/").split("/")[-2]
    r = post_form(admin, "/admin/keys/apikey/", {"action": "revoke_selected", "_selected_action": key_id, "index": "0"})
    assert r.status_code == 302
    soon(keyed.srv, lambda: keyed.models(secret).status_code == 401)


def test_a_class_lane_cap_set_in_the_admin_reaches_the_running_worker(keyed: Keyed, admin: httpx.Client) -> None:
    assert keyed.state()["class_lanes"] == {}
    r = post_form(admin, "/admin/keys/classlanecap/add/", {"model": "", "qos_class": "3", "max_lanes": "5"})
    assert r.status_code == 200 and "--max-batch (4)" in r.text  # validated against the worker's lanes
    r = post_form(admin, "/admin/keys/classlanecap/add/", {"model": "", "qos_class": "3", "max_lanes": "2", "_continue": "1"})
    assert r.status_code == 302, r.text[:2000]
    soon(keyed.srv, lambda: keyed.state()["class_lanes"] == {"background": 2})
    # a cap for this very model wins over the all-models one
    r = post_form(admin, "/admin/keys/classlanecap/add/", {"model": MODEL, "qos_class": "3", "max_lanes": "1", "_continue": "1"})
    assert r.status_code == 302
    model_cap_url = r.headers["location"]  # /admin/keys/classlanecap/<id>/change/
    soon(keyed.srv, lambda: keyed.state()["class_lanes"] == {"background": 1})
    # deleting it falls back to the all-models cap
    r = post_form(admin, model_cap_url.replace("/change/", "/delete/"), {"post": "yes"})
    assert r.status_code == 302
    soon(keyed.srv, lambda: keyed.state()["class_lanes"] == {"background": 2})


def test_no_secret_reaches_the_log_or_the_database(keyed: Keyed) -> None:
    log = keyed.srv.log()
    db = sqlite3.connect(Path(keyed.srv.data_dir) / "superfluid.sqlite3")
    try:
        dump = "\n".join(db.iterdump())
        last_used = db.execute("select last_used from keys_apikey where name = 'basic'").fetchone()[0]
    finally:
        db.close()
    assert keyed.keys and all(secret not in log and secret not in dump for secret in keyed.keys.values())
    assert "key=basic" in log  # the access log names the key
    assert last_used is not None
