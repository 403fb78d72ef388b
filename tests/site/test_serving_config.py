"""The serving configuration's owner (superfluid_site/serving.py): serve's installed value wins,
without one the settings (and so override_settings) describe it, and it cannot be changed."""

from __future__ import annotations

import dataclasses

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
