"""Deployment settings from the environment: behind a TLS proxy the admin's login works (trusted
origins, or the proxy's SSL header), cookies can be https-only, and serve's --host answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client, override_settings
from hypothesis import example, given
from hypothesis import strategies as st

from superfluid_site.deploy import csrf_trusted_origins, proxy_ssl_header, with_bound_host
from superfluid_site.env import EnvError

ROOT = Path(__file__).resolve().parents[2]
HOST = "llm.example.com"
PASSWORD = "a-long-test-password-9"


def settings_in_subprocess(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    code = (
        "import json, django; django.setup(); from django.conf import settings as s; "
        "print(json.dumps({'origins': s.CSRF_TRUSTED_ORIGINS, 'ssl': s.SECURE_PROXY_SSL_HEADER, "
        "'session': s.SESSION_COOKIE_SECURE, 'csrf': s.CSRF_COOKIE_SECURE, 'key': s.SUPERFLUID_API_KEY_SHA256, "
        "'policy': s.SUPERFLUID_API_KEY_POLICY, 'raw': [n for n in dir(s) if getattr(s, n) == 'container-secret-0123456789']}))"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SUPERFLUID_"))}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**base, "DJANGO_SETTINGS_MODULE": "superfluid_site.settings", "SUPERFLUID_DATA_DIR": str(tmp_path), **env},
    )


def test_the_environment_reaches_the_settings_and_defaults_are_off(tmp_path: Path) -> None:
    done = settings_in_subprocess({}, tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"origins": [], "ssl": None, "session": False, "csrf": False, "key": "", "policy": "", "raw": []}
    done = settings_in_subprocess(
        {
            "DJANGO_CSRF_TRUSTED_ORIGINS": "https://llm.example.com, https://*.example.org",
            "DJANGO_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",
            "DJANGO_SESSION_COOKIE_SECURE": "1",
            "DJANGO_CSRF_COOKIE_SECURE": "true",
            "SUPERFLUID_API_KEY": "container-secret-0123456789",
            "SUPERFLUID_API_KEY_POLICY": "containers",
        },
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["origins"] == ["https://llm.example.com", "https://*.example.org"]
    assert got["ssl"] == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert got["session"] is True and got["csrf"] is True and got["policy"] == "containers"
    assert len(got["key"]) == 64 and got["raw"] == []  # only the digest: no setting holds the secret


@pytest.mark.parametrize(
    "env, message",
    [
        ({"DJANGO_CSRF_TRUSTED_ORIGINS": "llm.example.com"}, "DJANGO_CSRF_TRUSTED_ORIGINS"),
        ({"DJANGO_SECURE_PROXY_SSL_HEADER": "X Forwarded Proto"}, "DJANGO_SECURE_PROXY_SSL_HEADER"),
        ({"DJANGO_SESSION_COOKIE_SECURE": "maybe"}, "DJANGO_SESSION_COOKIE_SECURE"),
        ({"SUPERFLUID_API_KEY": "too-short"}, "SUPERFLUID_API_KEY"),
    ],
)
def test_a_bad_deployment_value_stops_the_start_naming_the_variable(tmp_path: Path, env: dict[str, str], message: str) -> None:
    done = settings_in_subprocess(env, tmp_path)
    assert done.returncode != 0 and "EnvError" in done.stderr and message in done.stderr
    assert "too-short" not in done.stderr  # the key is never echoed


@pytest.mark.parametrize("listed", ["https://App.Example.com", "https://app.example.com/", "HTTPS://app.example.com:443"])
def test_an_allowed_browser_origin_is_matched_however_its_case_and_default_port_are_written(tmp_path: Path, listed: str) -> None:
    """SUPERFLUID_ALLOWED_ORIGINS is compared with the browser's Origin (lower case, no default
    port, no path) as text: one written otherwise started the server and every request from
    that page got 403."""
    code = "import django; django.setup(); from api.edge import origin_allowed; print(origin_allowed('https://app.example.com'))"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SUPERFLUID_"))}
    env = {**base, "DJANGO_SETTINGS_MODULE": "superfluid_site.settings", "SUPERFLUID_DATA_DIR": str(tmp_path), "SUPERFLUID_ALLOWED_ORIGINS": listed}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr


@pytest.mark.parametrize("listed", ["app.example.com", "https://*.example.com", "https://app.example.com/app"])
def test_an_allowed_browser_origin_that_no_browser_sends_stops_the_start(tmp_path: Path, listed: str) -> None:
    done = settings_in_subprocess({"SUPERFLUID_ALLOWED_ORIGINS": listed}, tmp_path)
    assert done.returncode != 0 and "EnvError" in done.stderr and "SUPERFLUID_ALLOWED_ORIGINS" in done.stderr


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("", None),
        ("X-Forwarded-Proto", ("HTTP_X_FORWARDED_PROTO", "https")),
        ("x-forwarded-ssl=on", ("HTTP_X_FORWARDED_SSL", "on")),
        (" X-Scheme = https ", ("HTTP_X_SCHEME", "https")),
    ],
)
def test_the_proxy_ssl_header_is_written_as_the_header_people_see(raw: str, expected: tuple[str, str] | None) -> None:
    assert proxy_ssl_header("V", raw) == expected


@given(st.text(max_size=30))
@example("-")
@example("--=https")
def test_any_proxy_header_value_is_a_header_or_refused(raw: str) -> None:
    try:
        got = proxy_ssl_header("V", raw)
    except EnvError as exc:
        assert "V=" in str(exc)
    else:
        assert got is None or (got[0].startswith("HTTP_") and got[0][5:].replace("_", "").isalnum() and got[1])


def test_origins_need_a_scheme_and_a_host() -> None:
    assert csrf_trusted_origins("V", ["https://a.example/", "http://b.example:8080"]) == ["https://a.example", "http://b.example:8080"]
    for bad in ("a.example", "ftp://a.example", "https://", "https://a.example/path", "https://[::1"):
        with pytest.raises(EnvError, match="V"):
            csrf_trusted_origins("V", [bad])


@pytest.mark.parametrize(
    "host, expected",
    [
        ("127.0.0.1", ["localhost", "127.0.0.1", "[::1]"]),  # already there
        ("192.168.1.20", ["localhost", "127.0.0.1", "[::1]", "192.168.1.20"]),
        ("fd00::1", ["localhost", "127.0.0.1", "[::1]", "[fd00::1]"]),
        ("[fd00::1]", ["localhost", "127.0.0.1", "[::1]", "[fd00::1]"]),
        ("LLM.lan", ["localhost", "127.0.0.1", "[::1]", "llm.lan"]),
        ("0.0.0.0", ["localhost", "127.0.0.1", "[::1]"]),  # any interface: names no host
        ("::", ["localhost", "127.0.0.1", "[::1]"]),
    ],
)
def test_serve_adds_the_host_it_binds_to_allowed_hosts(host: str, expected: list[str]) -> None:
    assert with_bound_host(["localhost", "127.0.0.1", "[::1]"], host) == expected
    assert with_bound_host(["*"], host) == ["*"]


# -- the admin's login behind a TLS proxy --------------------------------------------------


def login(client: Client, **headers: str) -> int:
    client.get("/admin/login/", HTTP_HOST=HOST, **headers)
    token = client.cookies["csrftoken"].value
    r = client.post(
        "/admin/login/?next=/admin/",
        {"username": "root", "password": PASSWORD, "csrfmiddlewaretoken": token, "next": "/admin/"},
        HTTP_HOST=HOST, HTTP_ORIGIN=f"https://{HOST}", HTTP_REFERER=f"https://{HOST}/admin/login/", **headers,
    )
    return r.status_code


@pytest.fixture
def root(django_user_model: object) -> object:
    return django_user_model.objects.create_superuser("root", "root@example.org", PASSWORD)  # type: ignore[attr-defined]


@pytest.mark.django_db
@override_settings(ALLOWED_HOSTS=[HOST], CSRF_TRUSTED_ORIGINS=[], SECURE_PROXY_SSL_HEADER=None)
def test_behind_a_tls_proxy_the_login_fails_until_the_origin_is_trusted(root: object) -> None:
    # the browser says https://HOST, the proxy forwards plain http: Django sees a foreign origin
    assert login(Client(enforce_csrf_checks=True)) == 403
    with override_settings(CSRF_TRUSTED_ORIGINS=[f"https://{HOST}"]):
        assert login(Client(enforce_csrf_checks=True)) == 302


@pytest.mark.django_db
@pytest.mark.parametrize("written", ["https://LLM.Example.com", "HTTPS://llm.example.com", "https://llm.example.com:443", "https://llm.example.com:443/"])
@override_settings(ALLOWED_HOSTS=[HOST], SECURE_PROXY_SSL_HEADER=None)
def test_a_trusted_origin_is_matched_however_its_case_and_default_port_are_written(root: object, written: str) -> None:
    """The browser sends its origin lower-case and without the scheme's default port; Django
    compares the setting's text as it is: DJANGO_CSRF_TRUSTED_ORIGINS=https://LLM.Example.com (or
    https://llm.example.com:443) started the server and refused every admin login with 403."""
    with override_settings(CSRF_TRUSTED_ORIGINS=csrf_trusted_origins("V", [written])):
        assert login(Client(enforce_csrf_checks=True)) == 302


@pytest.mark.django_db
@override_settings(ALLOWED_HOSTS=[HOST], CSRF_TRUSTED_ORIGINS=[], SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO", "https"))
def test_the_proxy_ssl_header_makes_the_request_https_only_when_the_proxy_says_so(root: object) -> None:
    assert login(Client(enforce_csrf_checks=True), HTTP_X_FORWARDED_PROTO="https") == 302
    assert login(Client(enforce_csrf_checks=True)) == 403  # no header: plain http
    assert login(Client(enforce_csrf_checks=True), HTTP_X_FORWARDED_PROTO="http") == 403


@pytest.mark.django_db
@override_settings(ALLOWED_HOSTS=[HOST], CSRF_TRUSTED_ORIGINS=[f"https://{HOST}"])
def test_secure_cookies_are_opt_in(root: object) -> None:
    client = Client(enforce_csrf_checks=True)
    assert login(client) == 302
    assert not client.cookies["sessionid"]["secure"] and not client.cookies["csrftoken"]["secure"]
    with override_settings(SESSION_COOKIE_SECURE=True, CSRF_COOKIE_SECURE=True):
        client = Client(enforce_csrf_checks=True)
        assert login(client) == 302
        assert client.cookies["sessionid"]["secure"] and client.cookies["csrftoken"]["secure"]
