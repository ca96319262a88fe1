"""The ASGI interface's types, in a file of their own (as starlette's ``types.py``): what
the app, the TLS gate in front of it and the connection layer pass each other, so that a
room that only wraps the app need not import it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

__all__ = ["Message", "Receive", "Scope", "Send"]
