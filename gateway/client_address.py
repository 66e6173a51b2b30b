"""The one place that decides a request's client address (what per-address limits count)."""
from __future__ import annotations

from starlette.types import Scope


def client_address(scope: Scope) -> str:
    """The socket peer's address; a proxy in front of the gateway would be counted as one client."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"
