"""Keys are required whenever the server binds beyond loopback."""

from __future__ import annotations

import pytest

from keys.binding import is_loopback


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_addresses(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "10.0.0.1", "example.org", ""])
def test_anything_else_reaches_beyond_this_machine(host: str) -> None:
    assert not is_loopback(host)
