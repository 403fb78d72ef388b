"""A --config file that is not a mapping at its top (a list, a bare word) stops serve with a
message that says what is wrong with the file, not an empty key name."""

from __future__ import annotations

import pytest

from scheduler.models_config import ConfigError, parse_config


@pytest.mark.parametrize("text", ["- smol\n- gemma\n", "smol\n", "? [a, b]\n: 1\n"])
def test_a_file_that_is_not_a_mapping_of_settings_says_so(text: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(text, "superfluid.yaml", check_path=lambda _p: None)
    message = str(err.value)
    assert message.startswith("superfluid.yaml:1: "), message
    assert ": :" not in message, message  # it named an empty key
    assert "models" in message, message  # what the file should hold
