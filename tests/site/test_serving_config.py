"""The serving configuration's owner (superfluid_site/serving.py): serve's installed value wins,
without one the settings (and so override_settings) describe it, and it cannot be changed."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import pytest
from django.test import override_settings

from api.admission import admit, keys_required, resolve_class
from api.errors import ApiError
from api.schemas import GenerationRequest
from scheduler.core.qos import QosClass
from superfluid_site.serving import ServingConfig, installed, serving
from tests.keys.test_admission import IP, runtime


def chat() -> GenerationRequest:
    return GenerationRequest(endpoint="chat", model="m", messages=[{"role": "user", "content": "hi"}])


def test_without_serve_the_settings_describe_the_configuration() -> None:
    with override_settings(SUPERFLUID_HTTP_DEFAULT_QOS="background", SUPERFLUID_MODELS=["a", "b"]):
        assert serving().http_default_qos == "background" and serving().models == ("a", "b")
        assert resolve_class({}, chat())[0] is QosClass.BACKGROUND
    assert resolve_class({}, chat())[0] is QosClass.AGENT


def test_an_installed_configuration_wins_over_the_settings_and_is_frozen() -> None:
    config = ServingConfig.from_settings(keys_required=True, http_default_qos="interactive")
    with override_settings(SUPERFLUID_KEYS_REQUIRED=False), installed(config):
        assert keys_required() and resolve_class({}, chat())[0] is QosClass.INTERACTIVE
    assert not keys_required()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_queue = 1  # type: ignore[misc]


async def test_admission_reads_the_installed_rate_limit() -> None:
    rt = runtime()
    with installed(ServingConfig.from_settings(rate_limit=1, client_concurrency=0, max_queue=0)):
        first = await admit({}, IP, chat(), runtime=rt)
        with pytest.raises(ApiError) as err:
            await admit({}, IP, chat(), runtime=rt)
        await first.release()
    assert err.value.code == "rate_limit_exceeded"


@pytest.mark.parametrize("flags", [["--max-body-bytes", "0"], ["--max-body-bytes", "-5"], ["--body-timeout", "-1"], ["--body-timeout", "nan"]])
def test_serve_refuses_request_bounds_that_cannot_work_before_starting_anything(flags: list[str]) -> None:
    """--max-body-bytes 0 refused every request with 413 and a negative --body-timeout bounded
    nothing, both without a word."""
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="--max-body-bytes must be at least 1 and --body-timeout"):
        call_command("serve", *flags)


def test_a_fleet_head_refuses_class_lanes_as_the_seed_says() -> None:
    """A head without an engine has no scheduler: --class-lanes there was dropped without a word
    (scheduling-and-qos seed: a fleet head refuses it; set it on each node)."""
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="--class-lanes .* on a fleet head"):
        call_command("serve", "--redis", "redis://127.0.0.1:1/0", "--no-engine", "--class-lanes", "background=1")


class _Installed(Exception):
    """Stops serve where it installs its serving configuration, before anything starts."""


@pytest.mark.django_db
def test_a_fleet_head_takes_the_admission_flags_the_seed_has_it_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/scheduling.md, "Fleet head": a departure from the seed, whose head refuses
    --http-default-qos, --no-http-qos-header and --http-allow-batch-invariant. Here the head is
    where a request is admitted (its class from the headers, the batch-invariant permission), so
    it takes the three and its admission honours them."""
    from django.core.management import call_command

    from scheduler.management.commands import serve as serve_module

    def stop(config: ServingConfig) -> None:
        raise _Installed(config)

    monkeypatch.setattr(serve_module, "install_serving", stop)
    flags = ("--http-default-qos", "interactive", "--no-http-qos-header", "--http-allow-batch-invariant")
    with pytest.raises(_Installed) as stopped:
        call_command("serve", "--redis", "redis://127.0.0.1:1/0", "--no-engine", *flags, stdout=io.StringIO())
    config = stopped.value.args[0]
    assert (config.http_default_qos, config.http_qos_header, config.http_allow_batch_invariant) == ("interactive", False, True)


@pytest.mark.parametrize(("flags", "message"), [(["--port", "70000"], "--port .* between 1 and 65535; got 70000"), (["--port", "0"], "--port"), (["--host", " "], "--host .* must name an address")])
def test_serve_refuses_an_address_it_cannot_bind_before_starting_anything(flags: list[str], message: str) -> None:
    """daphne found out only after the database was migrated and the worker started, with a
    traceback. (--no-engine without --redis is refused later: nothing starts on the old code.)"""
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match=message):
        call_command("serve", *flags, "--no-engine")


@pytest.mark.django_db
def test_an_explicit_empty_redis_flag_wins_over_redis_url(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """docs/configuration.md: a flag on the command line wins. With REDIS_URL set, `serve --redis ""`
    started its worker on the local socketpair while the web side took the Redis queue (and the
    Redis channel layer) from REDIS_URL: no worker read what it queued."""
    from scheduler.management.commands import serve as serve_module

    settings.SUPERFLUID_REDIS_URL = "redis://127.0.0.1:1/0"
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer"}}
    seen: dict[str, Any] = {}
    monkeypatch.setattr(serve_module, "install_serving", lambda config: seen.setdefault("serving", config))
    monkeypatch.setattr(serve_module, "override_django_settings", lambda **values: seen.setdefault("django", values))
    monkeypatch.setattr(serve_module.WorkerSupervisor, "start", lambda self: seen.setdefault("pair", self.pair))
    monkeypatch.setattr(serve_module.Command, "_run_web", lambda self, *args: None)
    from django.core.management import call_command

    call_command("serve", "--redis", "", stdout=io.StringIO())
    assert seen["pair"] is True  # the worker is on the local link ...
    assert seen["serving"].redis_url == ""  # ... and so is the web side
    assert seen["django"]["CHANNEL_LAYERS"]["default"]["BACKEND"] == "channels.layers.InMemoryChannelLayer"


def test_a_model_on_the_command_line_wins_over_superfluid_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """With SUPERFLUID_CONFIG set (a systemd unit's), `serve --model x.gguf` stopped with
    "--config names the models; leave out --model": the variable beat the flag. (The command
    goes on to refuse --no-engine without --redis, before anything starts.)"""
    from django.core.management import CommandError, call_command

    from scheduler.engines.models import default_model_path

    monkeypatch.setenv("SUPERFLUID_CONFIG", str(tmp_path / "superfluid.yaml"))
    with pytest.raises(CommandError, match="--no-engine needs --redis"):
        call_command("serve", "--model", str(default_model_path()), "--no-engine")


def test_a_config_on_the_command_line_wins_over_superfluid_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from django.core.management import CommandError, call_command

    from scheduler.engines.models import default_model_path

    config = tmp_path / "superfluid.yaml"
    config.write_text(f"models:\n  smol:\n    model: {default_model_path()}\n")
    monkeypatch.setenv("SUPERFLUID_MODEL", str(default_model_path()))
    with pytest.raises(CommandError, match="--no-engine needs --redis"):
        call_command("serve", "--config", str(config), "--no-engine")
    monkeypatch.setenv("SUPERFLUID_CONFIG", str(config))  # both variables, no flag: which one is meant?
    with pytest.raises(CommandError, match="SUPERFLUID_CONFIG and SUPERFLUID_MODEL are both set"):
        call_command("serve", "--no-engine")
    monkeypatch.delenv("SUPERFLUID_MODEL")  # the file alone, from its variable
    with pytest.raises(CommandError, match="--no-engine needs --redis"):
        call_command("serve", "--no-engine")


@pytest.mark.parametrize(
    ("variables", "flags"),
    [
        ({"SUPERFLUID_CLASS_LANES": "background=12"}, ["--max-batch", "16"]),  # valid with the flag's 16 lanes
        ({"SUPERFLUID_MODEL": "/nonexistent/stale.gguf"}, ["--model", "{model}"]),  # the flag names a model that exists
    ],
)
def test_serves_start_up_checks_take_the_flags_not_the_variables_they_override(monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], flags: list[str]) -> None:
    """The registered checks read the environment: serve (and the runengine it starts) stopped with
    E001/E002 for a variable its command-line flag overrode. serve checks the flags itself."""
    from django.core.management import CommandError, call_command

    from scheduler.engines.models import default_model_path

    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    argv = [f.format(model=default_model_path()) for f in flags]
    with pytest.raises(CommandError, match="--no-engine needs --redis"):  # past the checks and the flags' validation
        call_command("serve", *argv, "--no-engine", skip_checks=False)


@pytest.mark.django_db
def test_serve_fails_when_it_cannot_listen_on_its_port(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """daphne only logs "Listen failure" and returns: serve then printed "superfluid stopped" and
    exited 0 with the port taken, so a service manager (Restart=on-failure) saw a clean stop."""
    import signal
    import socket

    from django.core.management import CommandError, call_command

    from scheduler.management.commands import serve as serve_module

    monkeypatch.setattr(serve_module, "install_serving", lambda config: None)
    monkeypatch.setattr(serve_module, "override_django_settings", lambda **values: None)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}  # serve installs its own
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"cannot serve HTTP: .*127.0.0.1:{port}.*[Aa]ddress already in use"):
            call_command("serve", "--redis", "redis://127.0.0.1:1/0", "--no-engine", "--port", str(port), stdout=io.StringIO())
        assert "superfluid stopped" not in capsys.readouterr().out
    finally:
        taken.close()
        for s, handler in handlers.items():
            signal.signal(s, handler)
