"""serve --config: the seconds of ``ttl``, ``healthCheckTimeout`` and ``agingDivisor`` written in
exponent form, which YAML 1.2 (llama-swap's Go parser) reads as numbers and PyYAML's YAML 1.1
reads as strings."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.models_config import ConfigError, parse_config


def parsed(text: str):  # type: ignore[no-untyped-def]
    return parse_config(text, "f.yaml", Path("/"), check_path=lambda _p: None)


@pytest.mark.parametrize("written, seconds", [("3e2", 300.0), ("1.5e3", 1500.0), ("6E1", 60.0), ("+2e1", 20.0), ("1.2e+2", 120.0)])
def test_seconds_in_exponent_form_are_numbers(written: str, seconds: float) -> None:
    """``ttl: 3e2`` stopped serve with "must be a finite number, got '3e2'"."""
    cfg = parsed(f"models:\n  a:\n    model: a.gguf\n    ttl: {written}\nhealthCheckTimeout: {written}\nrouting:\n  scheduler:\n    settings:\n      serial:\n        agingDivisor: {written}\n")
    assert cfg.models[0].ttl_s == seconds
    assert cfg.load_timeout_s == seconds and cfg.aging_divisor_s == seconds


@pytest.mark.parametrize("written", ['"300"', "'3e2'", "1e400", "3e", "e3", "1_e"])
def test_a_quoted_string_or_something_else_is_still_no_number(written: str) -> None:
    with pytest.raises(ConfigError, match=r"f.yaml:4: models.a.ttl: must be a finite number"):
        parsed(f"models:\n  a:\n    model: a.gguf\n    ttl: {written}\n")
