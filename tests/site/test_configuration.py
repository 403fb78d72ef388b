"""Configuration from the environment: typed reads that refuse bad values, DATABASE_URL with its
query options, and the system checks that name a serving configuration that cannot work."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from scheduler.checks import binding_warnings, class_lanes_errors, model_errors, usable_key_exists
from scheduler.management.options import _env
from superfluid_site.env import FALSE, TRUE, EnvError, env_bool, env_int, env_list
from superfluid_site.settings import _database


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


@pytest.mark.parametrize("raw, expected", [("1", True), ("TRUE", True), (" on ", True), ("no", False), ("0", False), ("", True)])
def test_booleans_read_every_documented_spelling_and_empty_means_the_default(monkeypatch: pytest.MonkeyPatch, raw: str, expected: bool) -> None:
    monkeypatch.setenv("SF_TEST_FLAG", raw)
    assert env_bool("SF_TEST_FLAG", True) is expected


@given(raw=st.text(min_size=1, max_size=12))
def test_any_environment_value_is_read_as_documented_or_refused_never_guessed(raw: str) -> None:
    """Hostile values: a boolean is one of the documented spellings or an error naming the
    variable; an integer is int() of the text or an error. Nothing falls back silently."""
    if "\0" in raw:
        return  # the environment cannot hold NUL
    os.environ["SF_TEST_FUZZ"] = raw
    try:
        word = raw.strip().lower()
        if word in TRUE or word in FALSE:
            assert env_bool("SF_TEST_FUZZ", False) is (word in TRUE)
        else:
            with pytest.raises(EnvError, match="SF_TEST_FUZZ"):
                env_bool("SF_TEST_FUZZ", False)
        try:
            expected = int(raw)
        except ValueError:
            with pytest.raises(EnvError, match="SF_TEST_FUZZ"):
                env_int("SF_TEST_FUZZ", 7)
        else:
            assert env_int("SF_TEST_FUZZ", 7) == expected
    finally:
        del os.environ["SF_TEST_FUZZ"]


def test_lists_drop_blanks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SF_TEST_LIST", " a.example, ,b.example,")
    assert env_list("SF_TEST_LIST", "x") == ["a.example", "b.example"]


def test_serving_flags_read_their_variables_with_the_same_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """A boolean flag's variable used to be read as "not one of the true spellings": a typo
    meant off. It now stops with the variable's name, as the settings do."""
    monkeypatch.setenv("SUPERFLUID_SOME_SWITCH", "ture")
    with pytest.raises(CommandError, match="SUPERFLUID_SOME_SWITCH='ture' is not a boolean"):
        _env("--some-switch", False)
    monkeypatch.setenv("SUPERFLUID_MAX_BATCH", "eight")
    with pytest.raises(CommandError, match="--max-batch.*not an integer"):
        _env("--max-batch", 8)
    monkeypatch.setenv("SUPERFLUID_MAX_BATCH", "4")
    assert _env("--max-batch", 8) == 4


def test_database_url_keeps_its_query_options_and_sqlite_keeps_its_locking() -> None:
    pg = _database("postgres://app:p%40ss@db.internal:5433/superfluid?sslmode=require&connect_timeout=5")
    assert pg["ENGINE"] == "django.db.backends.postgresql"
    assert (pg["NAME"], pg["USER"], pg["PASSWORD"], pg["HOST"], pg["PORT"]) == ("superfluid", "app", "p@ss", "db.internal", 5433)
    assert pg["OPTIONS"] == {"sslmode": "require", "connect_timeout": 5}
    lite = _database("sqlite:////var/lib/superfluid/db.sqlite3")
    assert lite["NAME"] == "/var/lib/superfluid/db.sqlite3"
    assert lite["OPTIONS"] == {"transaction_mode": "IMMEDIATE", "timeout": 20}
    assert str(_database("")["NAME"]).endswith("superfluid.sqlite3")
    assert _database("sqlite://")["NAME"] == _database("")["NAME"]
    with pytest.raises(EnvError, match="DATABASE_URL"):
        _database("mongodb://host/db")


def test_class_lanes_that_cannot_work_are_error_e001() -> None:
    assert class_lanes_errors("background=2,agent=6", 8) == []
    assert ids(class_lanes_errors("background=9", 8)) == ["superfluid.E001"]
    assert ids(class_lanes_errors("bulk=1", 8)) == ["superfluid.E001"]
    assert ids(class_lanes_errors("agent", 8)) == ["superfluid.E001"]


def test_a_missing_or_unreadable_model_is_error_e002(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    assert ids(model_errors(str(model))) == ["superfluid.E002"]
    model.write_bytes(b"GGUF")
    assert model_errors(str(model)) == []
    assert model_errors("") == []  # the bundled default
    if os.geteuid() != 0:  # root reads everything
        model.chmod(0)
        assert ids(model_errors(str(model))) == ["superfluid.E002"]


def test_binding_beyond_loopback_or_requiring_keys_without_one_is_warning_w001() -> None:
    assert binding_warnings("127.0.0.1", False, lambda: False) == []
    assert ids(binding_warnings("0.0.0.0", False, lambda: False)) == ["superfluid.W001"]
    assert ids(binding_warnings("::1", True, lambda: False)) == ["superfluid.W001"]
    assert binding_warnings("0.0.0.0", False, lambda: True) == []


@pytest.mark.django_db
def test_only_a_key_neither_revoked_nor_expired_counts_as_usable() -> None:
    from keys.models import ApiKey

    assert not usable_key_exists()
    ApiKey.objects.create(name="old", prefix="sf-a", digest="a" * 64, revoked=True)
    ApiKey.objects.create(name="gone", prefix="sf-b", digest="b" * 64, expires=timezone.now() - datetime.timedelta(days=1))
    assert not usable_key_exists()
    ApiKey.objects.create(name="live", prefix="sf-c", digest="c" * 64)
    assert usable_key_exists()


@pytest.mark.django_db
def test_manage_py_check_stops_on_a_bad_environment_and_names_the_ids(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SUPERFLUID_CLASS_LANES", "agent=99")
    monkeypatch.setenv("SUPERFLUID_MODEL", str(tmp_path / "missing.gguf"))
    monkeypatch.setenv("SUPERFLUID_HOST", "0.0.0.0")
    with pytest.raises(SystemCheckError) as raised:
        call_command("check")
    text = str(raised.value)
    assert "superfluid.E001" in text and "superfluid.E002" in text and "superfluid.W001" in text
    for name in ("SUPERFLUID_CLASS_LANES", "SUPERFLUID_MODEL", "SUPERFLUID_HOST"):
        monkeypatch.delenv(name)
    call_command("check")  # the defaults pass


@pytest.fixture
def restore_loop_policy() -> Any:
    """The process's event loop policy, put back after the test."""
    import asyncio

    before = asyncio.get_event_loop_policy()
    yield
    asyncio.set_event_loop_policy(before)


@pytest.mark.usefixtures("restore_loop_policy")
@pytest.mark.parametrize(("raw", "expected"), [("", "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")])
def test_serve_runs_on_uvloop_unless_the_environment_says_asyncio(monkeypatch: pytest.MonkeyPatch, raw: str, expected: str) -> None:
    import asyncio

    from superfluid_site.eventloop import loop_name, use_event_loop

    asyncio.set_event_loop_policy(None)
    monkeypatch.setenv("SUPERFLUID_EVENT_LOOP", raw)
    assert use_event_loop() == expected
    loop = asyncio.new_event_loop()
    try:
        assert loop_name(loop) == expected
    finally:
        loop.close()


@pytest.mark.usefixtures("restore_loop_policy")
def test_an_unknown_event_loop_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from superfluid_site.eventloop import use_event_loop

    asyncio.set_event_loop_policy(None)
    monkeypatch.setenv("SUPERFLUID_EVENT_LOOP", "trio")
    with pytest.raises(EnvError, match="SUPERFLUID_EVENT_LOOP='trio'"):
        use_event_loop()
    assert type(asyncio.get_event_loop_policy()).__module__.startswith("asyncio")


def test_a_process_without_serves_flags_reads_keys_required_and_the_policy_file_from_the_environment(tmp_path: Path) -> None:
    """A Celery worker running batch lines has serve's environment but not its flags: a file
    key's lines were 401 (it never read SUPERFLUID_KEY_POLICY), and SUPERFLUID_HOST beyond
    loopback did not make keys required there as it does in serve."""
    import json
    import subprocess
    import sys

    code = (
        "import django, json; django.setup(); from superfluid_site.serving import ServingConfig; "
        "c = ServingConfig.from_settings(); print(json.dumps([c.keys_required, c.key_policy_file]))"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root, "DJANGO_SETTINGS_MODULE": "superfluid_site.settings", "SUPERFLUID_KEY_POLICY": "policies.json", "SUPERFLUID_HOST": "0.0.0.0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout.splitlines()[-1]) == [True, str(tmp_path / "policies.json")]


def serve_defaults(*argv: str) -> dict[str, Any]:
    """serve's options for ``argv`` as its parser reads them now (flag defaults from the environment)."""
    import argparse

    from scheduler.management.commands.serve import Command as Serve

    parser = argparse.ArgumentParser()
    Serve().add_arguments(parser)
    return vars(parser.parse_args(list(argv)))


def test_a_float_flags_variable_takes_a_fraction_as_the_flag_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/configuration.md: --aging-divisor is "a number (0.5 allowed)"; its variable was read
    as an integer, so SUPERFLUID_AGING_DIVISOR=0.5 stopped serve with "is not an integer"."""
    monkeypatch.setenv("SUPERFLUID_AGING_DIVISOR", "0.5")
    assert serve_defaults()["aging_divisor"] == 0.5
    for bad in ("nan", "inf", "60s"):
        monkeypatch.setenv("SUPERFLUID_AGING_DIVISOR", bad)
        with pytest.raises(CommandError, match=f"SUPERFLUID_AGING_DIVISOR='{bad}'"):
            serve_defaults()


def test_env_float_reads_finite_numbers_and_names_the_variable_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    from superfluid_site.env import env_float

    monkeypatch.setenv("SF_TEST_NUM", "2.5")
    assert env_float("SF_TEST_NUM", 30) == 2.5
    monkeypatch.setenv("SF_TEST_NUM", "")
    assert env_float("SF_TEST_NUM", 30) == 30
    for bad in ("nan", "-inf", "10s"):
        monkeypatch.setenv("SF_TEST_NUM", bad)
        with pytest.raises(EnvError, match="SF_TEST_NUM"):
            env_float("SF_TEST_NUM", 30)


def test_the_body_timeout_variable_takes_what_the_flag_takes(tmp_path: Path) -> None:
    """--body-timeout is a number of seconds (2.5 works); SUPERFLUID_BODY_TIMEOUT=2.5 stopped
    every manage.py command at the settings with "is not an integer"."""
    import json
    import subprocess
    import sys

    code = "import django, json; django.setup(); from django.conf import settings; print(json.dumps(settings.SUPERFLUID_BODY_TIMEOUT))"
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root, "DJANGO_SETTINGS_MODULE": "superfluid_site.settings", "SUPERFLUID_BODY_TIMEOUT": "2.5"}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-500:]
    assert json.loads(out.stdout.splitlines()[-1]) == 2.5


def test_host_and_port_variables_follow_the_rules_of_every_other_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty SUPERFLUID_PORT crashed even `serve --help` with a bare ValueError (empty means
    the default everywhere else), a typo in it named no variable, and an empty SUPERFLUID_HOST
    was bound as "", which daphne refused with a traceback after the worker had started."""
    monkeypatch.setenv("SUPERFLUID_PORT", "")
    monkeypatch.setenv("SUPERFLUID_HOST", "")
    options = serve_defaults()
    assert (options["host"], options["port"]) == ("127.0.0.1", 8000)
    monkeypatch.setenv("SUPERFLUID_PORT", "80a")
    with pytest.raises(CommandError, match="SUPERFLUID_PORT='80a' is not an integer"):
        serve_defaults()
    monkeypatch.setenv("SUPERFLUID_PORT", "9001")
    monkeypatch.setenv("SUPERFLUID_HOST", "0.0.0.0")
    options = serve_defaults()
    assert (options["host"], options["port"]) == ("0.0.0.0", 9001)
    assert serve_defaults("--port", "9002")["port"] == 9002  # the flag wins


@pytest.mark.parametrize("flag", ["--threads", "--starvation-ticks", "--prefix-cache-slots", "--host-cache-mb", "--drain-timeout"])
def test_a_negative_count_is_refused_not_read_as_zero(flag: str) -> None:
    """0 means something documented for each (all cores, no aging, no cache, drop, cut at once);
    a negative value was accepted and meant the same (or reached llama.cpp as is) without a word."""
    from scheduler.management.options import scheduler_config

    options = serve_defaults(f"{flag}=-1")
    with pytest.raises(CommandError, match=f"{flag} must be 0 .* or positive; got -1"):
        scheduler_config(options)
    options[flag.lstrip("-").replace("-", "_")] = 0
    scheduler_config(options)


def test_a_context_larger_than_llama_cpp_can_size_is_refused() -> None:
    """Every lane and cache slot is --ctx-size cells of one llama.cpp context, whose size is a
    uint32: --ctx-size 2**28 for 8 lanes and 8 slots wrapped round to 0 cells there."""
    from scheduler.management.options import scheduler_config

    options = serve_defaults("--ctx-size=268435456", "--max-batch=8", "--prefix-cache-slots=8")
    with pytest.raises(CommandError, match="more than one context holds"):
        scheduler_config(options)
    options["ctx_size"] = 2**28 - 1
    assert scheduler_config(options).lane_ctx == 2**28 - 1


@pytest.mark.parametrize(
    ("name", "value"),
    [("SUPERFLUID_ENGINE_WAIT_S", -1), ("SUPERFLUID_ACTIVITY_RETENTION_DAYS", -1), ("SUPERFLUID_BATCH_MAX_FILE_BYTES", -1), ("SUPERFLUID_BATCH_CONCURRENCY", 0), ("SUPERFLUID_BATCH_MAX_LINES", 0), ("SUPERFLUID_BATCH_LEASE_S", 0), ("SUPERFLUID_BATCH_STALL_S", 0)],
)
def test_a_number_only_a_variable_sets_is_checked_against_its_bound_e004(settings: Any, name: str, value: int) -> None:
    """These were clamped or misread where they are used, without a word (a negative
    SUPERFLUID_BATCH_MAX_FILE_BYTES refused every batch file with 413). serve runs this check."""
    from scheduler.checks import check_setting_ranges

    assert check_setting_ranges() == []
    setattr(settings, name, value)
    messages = check_setting_ranges()
    assert ids(messages) == ["superfluid.E004"] and f"{name}={value}" in messages[0].msg


@pytest.mark.django_db
def test_serve_still_runs_the_checks_of_numbers_no_flag_sets(settings: Any) -> None:
    from django.core.management import call_command

    settings.SUPERFLUID_BATCH_MAX_LINES = 0
    with pytest.raises(SystemCheckError, match="superfluid.E004"):
        call_command("serve", "--no-engine", skip_checks=False)
