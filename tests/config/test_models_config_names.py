"""--config files: an alias that repeats a name of its own model, and a file nested too deeply."""

from __future__ import annotations

import pytest

from scheduler.models_config import ConfigError, parse_config


@pytest.mark.parametrize("aliases", ["[smol]", "[small, small]"])
def test_an_alias_that_repeats_a_name_of_its_own_model_is_refused(aliases: str) -> None:
    """``aliases: [smol]`` on the model ``smol`` was accepted: /v1/models then listed ``smol``
    twice (once as the model, once as an alias of itself), and a repeated alias twice too."""
    text = f"models:\n  smol:\n    model: m.gguf\n    aliases: {aliases}\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text, "superfluid.yaml", check_path=lambda _p: None)
    assert str(err.value).startswith("superfluid.yaml:"), str(err.value)
    assert "smol" in str(err.value) or "small" in str(err.value)


@pytest.mark.parametrize("opener", ["[", "{a: "])
def test_a_file_nested_thousands_deep_is_one_line_not_a_recursion_error(opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    text = "models: " + opener * 3000 + "1" + closer * 3000 + "\n"
    with pytest.raises(ConfigError) as err:
        parse_config(text, "superfluid.yaml", check_path=lambda _p: None)
    message = str(err.value)
    assert message.startswith("superfluid.yaml") and "\n" not in message, message
