"""The web process's event loop: uvloop's under daphne, unless told otherwise.

Daphne runs Django on Twisted's asyncio reactor, which drives an asyncio event loop made when the
``daphne`` app is imported (during ``django.setup()``). ``manage.py serve`` calls
:func:`use_event_loop` before that, so the reactor, the link to the worker and every consumer run
on uvloop's loop (libuv, in C) instead of the standard library's selector loop: the same code, less
Python per event. Each streamed token is a few loop turns (the link's read, the consumer, the
socket write), so the loop's own cost is paid per token: uvloop takes ~9% off the web process's
CPU per token here (docs/benchmarks.md).

``SUPERFLUID_EVENT_LOOP=asyncio`` keeps the standard library's loop, which is also what runs where
uvloop is not installed (Windows has none).
"""

from __future__ import annotations

import asyncio

from .env import EnvError, env_str

LOOPS = ("uvloop", "asyncio")


def use_event_loop() -> str:
    """Set the event loop policy ``SUPERFLUID_EVENT_LOOP`` asks for; return the loop in use.

    Call before ``django.setup()``: a loop made before this is not replaced."""
    choice = env_str("SUPERFLUID_EVENT_LOOP", "uvloop")
    if choice.strip().lower() in LOOPS:  # in any case, as SUPERFLUID_LOG_LEVEL
        choice = choice.strip().lower()
    if choice not in LOOPS:
        raise EnvError(f"SUPERFLUID_EVENT_LOOP={choice!r} is not one of {', '.join(LOOPS)}")
    if choice == "uvloop":
        try:
            import uvloop
        except ImportError:
            return "asyncio"
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return choice


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: which loop ``loop`` is."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
