"""``serve --no-prefill-assistant`` (SUPERFLUID_NO_PREFILL_ASSISTANT=1) reaches the web side's
configuration: a chat's last assistant turn is then a turn, not a prefill (docs/api.md
#assistant-prefill); without it the prefill is on, as llama-server's default."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command

from superfluid_site.serving import ServingConfig


def served(monkeypatch: pytest.MonkeyPatch, *flags: str) -> ServingConfig:
    """The configuration ``serve`` installs with ``flags`` (nothing started)."""
    from scheduler.management.commands import serve as serve_module

    seen: dict[str, Any] = {}
    monkeypatch.setattr(serve_module, "install_serving", lambda config: seen.setdefault("serving", config))
    monkeypatch.setattr(serve_module.WorkerSupervisor, "start", lambda self: None)
    monkeypatch.setattr(serve_module.Command, "_run_web", lambda self, *args: None)
    call_command("serve", *flags, stdout=io.StringIO())
    config: ServingConfig = seen["serving"]
    return config


@pytest.mark.django_db
def test_the_flag_turns_the_prefill_off_and_it_is_on_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert served(monkeypatch).prefill_assistant is True
    assert served(monkeypatch, "--no-prefill-assistant").prefill_assistant is False
