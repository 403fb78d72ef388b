"""Whether a bind address keeps the server on this machine (then API keys are optional)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``; anything else (0.0.0.0, ::, a LAN address,
    a host name) reaches beyond this machine."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
