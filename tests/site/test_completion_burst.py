"""serve --completion-rate 0 (the FIM bucket off) with --completion-burst 0."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command


def test_a_zero_burst_beside_a_zero_rate_is_not_refused() -> None:
    """`serve --completion-rate 0 --completion-burst 0` (the FIM bucket off, both its numbers
    zeroed) stopped serve with "--completion-burst must be at least 1": a capacity for a bucket
    that does not exist. --max-body-bytes 0 stops serve right after, before anything starts."""
    with pytest.raises(CommandError) as err:
        call_command("serve", "--completion-rate", "0", "--completion-burst", "0", "--max-body-bytes", "0")
    assert "--max-body-bytes" in str(err.value), str(err.value)


def test_a_zero_burst_with_a_rate_is_still_refused() -> None:
    with pytest.raises(CommandError, match="--completion-burst"):
        call_command("serve", "--completion-rate", "10/s", "--completion-burst", "0", "--max-body-bytes", "0")
