"""Who is at the other end of a Unix socket: both ends of the local link refuse a peer of another
uid (the worker in ``scheduler/worker/server.py``, the web side in ``client.py``). A leaf module,
so the worker's server does not import the web side's client for it."""

from __future__ import annotations

import socket
import struct


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)
