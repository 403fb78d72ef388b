"""The request-priority seed caps swapAffinityBonus at 99, so that it can never promote a request
into the next band: docs/scheduling.md says the cap is a bound, refused at start outside 0-99
(the flag here; the config file's key in tests/config/test_models_config.py), never lowered to
99 in silence."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command


@pytest.mark.parametrize("value", ["100", "-1"])
def test_serve_refuses_a_swap_affinity_bonus_outside_0_to_99(value: str) -> None:
    with pytest.raises(CommandError, match=rf"--swap-affinity-bonus must be between 0 and 99; got {value}"):
        call_command("serve", "--swap-affinity-bonus", value)
