"""A key written with no value (``model:``, ``ttl:``) is named for what it lacks, not as YAML the
file could not be read as: the message said "cannot be read: while parsing a block node"."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.models_config import ConfigError, parse_config


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models:\n  a:\n    model:\n", ":3: models.a.model: must be a non-empty string, got ''"),
        ("models:\n  a:\n    model: a.gguf\n    max_batch:\n", ":4: models.a.max_batch: must be an integer, got ''"),
        ("models:\n  a:\n    model: a.gguf\n    ctx_size:\n", ":4: models.a.ctx_size: must be an integer, got ''"),
        ("models:\n  a:\n    model: a.gguf\n    ttl:\n", ":4: models.a.ttl: must be a finite number, got ''"),
        ("models:\n  a:\n    model: a.gguf\n    aliases: [b, ]\n    ttl: 1\n", None),
        ("models:\n  a:\n    model: a.gguf\nhealthCheckTimeout:\n", ":4: healthCheckTimeout: must be a finite number, got ''"),
        ("models:\n  a:\n    model: a.gguf\nrouting:\n  scheduler:\n    use:\n", ":6: routing.scheduler.use: must be a non-empty string, got ''"),
    ],
)
def test_an_empty_value_is_named_for_what_it_lacks(text: str, message: str | None) -> None:
    if message is None:  # a trailing comma in a flow list is no empty alias
        assert parse_config(text, "f.yaml", Path("/tmp"), lambda p: None).models[0].aliases == ("b",)
        return
    with pytest.raises(ConfigError) as err:
        parse_config(text, "f.yaml", Path("/tmp"), lambda p: None)
    assert str(err.value) == "f.yaml" + message
    assert "parsing" not in str(err.value)


@pytest.mark.parametrize(("written", "value"), [("!!int '8'", 8), ("0x8", 8), ("8", 8)])
def test_a_tagged_or_hex_integer_still_reads(written: str, value: int) -> None:
    cfg = parse_config(f"models:\n  a:\n    model: a.gguf\n    max_batch: {written}\n", "f.yaml", Path("/tmp"), lambda p: None)
    assert cfg.models[0].max_batch == value


def test_an_unsafe_tag_is_still_refused() -> None:
    with pytest.raises(ConfigError, match=r"models\.a\.model: cannot be read: could not determine a constructor"):
        parse_config("models:\n  a:\n    model: !!python/object:os.system x\n", "f.yaml", Path("/tmp"), lambda p: None)
