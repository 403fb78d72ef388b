"""serve's configuration and start-up (review 32): what an operator's flags and variables mean."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from scheduler.engines.models import default_model_path

ROOT = str(Path(__file__).resolve().parents[2])


def _settings_in_a_new_process(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    code = "import django, logging; django.setup(); print(logging.getLogger('superfluid').level)"
    full = {**os.environ, "PYTHONPATH": ROOT, "DJANGO_SETTINGS_MODULE": "superfluid_site.settings", "SUPERFLUID_DATA_DIR": str(tmp_path), **env}
    return subprocess.run([sys.executable, "-c", code], env=full, cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_the_log_level_variable_is_read_in_any_case_and_a_bad_one_is_named(tmp_path: Path) -> None:
    """SUPERFLUID_LOG_LEVEL=debug stopped every manage.py command (serve included) with a
    traceback ending in "ValueError: Unable to configure logger 'superfluid'", naming no
    variable; so did a typo. docs/configuration.md: any other value stops the process with the
    variable's name."""
    out = _settings_in_a_new_process(tmp_path, SUPERFLUID_LOG_LEVEL="debug")
    assert out.returncode == 0, out.stderr[-800:]
    assert out.stdout.split()[-1] == "10"  # logging.DEBUG
    out = _settings_in_a_new_process(tmp_path, SUPERFLUID_LOG_LEVEL="loud")
    assert out.returncode != 0
    assert "SUPERFLUID_LOG_LEVEL='loud'" in out.stderr


def test_class_lanes_are_checked_against_each_configured_models_lanes_not_the_flag(tmp_path: Path) -> None:
    """docs/configuration.md: with --config, `--class-lanes` caps are checked against each model's
    `max_batch`. A file giving every model 16 lanes with --class-lanes agent=12 was refused
    against --max-batch's default 8. (The command goes on to refuse --no-engine without --redis,
    past the flags' validation, before anything starts.)"""
    config = tmp_path / "superfluid.yaml"
    config.write_text(f"models:\n  smol:\n    model: {default_model_path()}\n    max_batch: 16\n")
    with pytest.raises(CommandError, match="--no-engine needs --redis"):
        call_command("serve", "--config", str(config), "--class-lanes", "agent=12", "--no-engine")
    # a cap above a model's own lanes is still refused, naming the model
    config.write_text(f"models:\n  smol:\n    model: {default_model_path()}\n    max_batch: 4\n")
    with pytest.raises(CommandError, match="model smol: --class-lanes cap for agent must be between 1 and --max-batch \\(4\\)"):
        call_command("serve", "--config", str(config), "--class-lanes", "agent=6", "--no-engine")


def _serve_up_to_the_start(monkeypatch: pytest.MonkeyPatch, *argv: str) -> str:
    """serve's start-up with nothing started: its stderr."""
    from scheduler.management.commands import serve as serve_module

    monkeypatch.setattr(serve_module, "install_serving", lambda config: None)
    monkeypatch.setattr(serve_module, "override_django_settings", lambda **values: None)
    monkeypatch.setattr(serve_module.WorkerSupervisor, "start", lambda self: None)
    monkeypatch.setattr(serve_module.Command, "_run_web", lambda self, *args: None)
    err = io.StringIO()
    call_command("serve", *argv, stdout=io.StringIO(), stderr=err)
    return err.getvalue()


@pytest.mark.django_db
def test_keys_in_the_key_policy_file_are_usable_keys_for_warning_w001(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`serve --host 0.0.0.0 --key-policy keys.json` with a key in the file warned "no usable API
    key exists: every API request will get 401", while that key's requests were answered; so
    did `manage.py check` with SUPERFLUID_KEY_POLICY."""
    from scheduler.checks import check_serving_environment

    policy = tmp_path / "keys.json"
    policy.write_text(json.dumps({"keys": [{"name": "ci-bot", "sha256": hashlib.sha256(b"sf-secret-secret-secret").hexdigest()}]}))
    assert "W001" not in _serve_up_to_the_start(monkeypatch, "--host", "0.0.0.0", "--key-policy", str(policy))
    monkeypatch.setenv("SUPERFLUID_HOST", "0.0.0.0")
    monkeypatch.setenv("SUPERFLUID_KEY_POLICY", str(policy))
    assert [m.id for m in check_serving_environment()] == []
    # a file without keys still leaves every request without one
    policy.write_text(json.dumps({"policies": [{"name": "ci"}]}))
    assert "superfluid.W001" in _serve_up_to_the_start(monkeypatch, "--host", "0.0.0.0", "--key-policy", str(policy))
    assert [m.id for m in check_serving_environment()] == ["superfluid.W001"]


def test_the_link_socket_path_never_replaces_a_file_that_is_not_a_socket(tmp_path: Path) -> None:
    """`runengine --socket PATH` (and `serve --socket PATH`, which hands it on) deleted whatever
    regular file PATH named (a typo'd path, the database) to bind its socket there; only a stale
    socket file, which refuses connections, is replaced."""
    from scheduler.worker.server import LinkServer, check_not_listening

    tmp_path.chmod(0o700)
    precious = tmp_path / "superfluid.sqlite3"
    precious.write_bytes(b"SQLite format 3\0")
    with pytest.raises(ValueError, match="not a socket"):
        check_not_listening(str(precious))
    import queue

    with pytest.raises(ValueError, match="not a socket"):
        LinkServer(queue.SimpleQueue(), path=str(precious)).start()
    assert precious.read_bytes() == b"SQLite format 3\0"
    # a stale socket file (nobody listens) is still replaced
    stale = tmp_path / "engine.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()
    check_not_listening(str(stale))
    server = LinkServer(queue.SimpleQueue(), path=str(stale))
    server.start()
    server.close()


@pytest.mark.django_db
def test_serve_refuses_a_socket_path_that_names_a_file_before_starting_anything(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """serve started its worker, which refused the path (after the fix above) or deleted the
    file (before it); serve then removed the path itself as it stopped: the file was lost either
    way."""
    tmp_path.chmod(0o700)
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    with pytest.raises(CommandError, match="--socket: .*not a socket"):
        _serve_up_to_the_start(monkeypatch, "--socket", str(precious))
    assert precious.read_text() == "keep me"


def test_a_bad_variable_stops_any_command_with_one_line_naming_it(tmp_path: Path) -> None:
    """`SUPERFLUID_MAX_QUEUE=abc python manage.py serve` printed a 30-line traceback before the
    line that named the variable."""
    env = {**os.environ, "SUPERFLUID_DATA_DIR": str(tmp_path), "SUPERFLUID_MAX_QUEUE": "abc"}
    out = subprocess.run([sys.executable, "manage.py", "check"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip() == "check: SUPERFLUID_MAX_QUEUE='abc' is not an integer"


@pytest.mark.parametrize(("low", "high"), [("70", "150"), ("90", "85"), ("0", "85")])
def test_pressure_watermarks_out_of_range_are_refused_in_the_flags_own_percentages(low: str, high: str) -> None:
    """The flags take percentages (85); `--pressure-high 150` was refused with "pressure
    watermarks need 0 < low < high <= 1", a rule in fractions no flag takes."""
    with pytest.raises(CommandError, match=rf"percentages with 0 < low < high <= 100; got --pressure-low {low} --pressure-high {high}"):
        call_command("serve", "--pressure-low", low, "--pressure-high", high)


@pytest.mark.parametrize(("flag", "value", "message"), [("--max-batch", "0", "--max-batch must be between 1 and 64"), ("--ctx-size", "10", "--ctx-size must be at least 64")])
def test_a_lane_flag_out_of_range_is_refused_though_every_configured_model_sets_its_own(tmp_path: Path, flag: str, value: str, message: str) -> None:
    """With --config, a model's own max_batch and ctx_size replace the flags: `--max-batch 0`
    (no lanes at all) was accepted without a word when every model set max_batch, as a
    `--ctx-size 10` when every model set ctx_size."""
    config = tmp_path / "superfluid.yaml"
    config.write_text(f"models:\n  smol:\n    model: {default_model_path()}\n    max_batch: 4\n    ctx_size: 1024\n")
    with pytest.raises(CommandError, match=message):
        call_command("serve", "--config", str(config), flag, value, "--no-engine")
