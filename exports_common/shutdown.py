"""A graceful shutdown, told to whatever must end at once rather than hold the server up.

uvicorn stops accepting on SIGTERM or SIGINT, then asks each open connection to shut
down and waits for every open request to finish; a request that lasts until its client
leaves (an event stream) would hold it until the graceful-shutdown timeout, or for ever.
The bounded protocol (`exports_common.connection_limits`) calls `begin` when uvicorn asks
its connection to shut down, which tells the callbacks registered here (`on_shutdown`),
so those requests end first and the shutdown goes on at once. Through the protocol, it
holds alike in the one process of `run` and in each worker of uvicorn's supervisor.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("shutdown")
_callbacks: list[Callable[[], None]] = []
_state = {"begun": False}


def on_shutdown(callback: Callable[[], None]) -> None:
    """Call `callback` (once, in the event loop's thread) when the process begins a graceful shutdown."""
    _callbacks.append(callback)


def begun() -> bool:
    return _state["begun"]


def begin() -> None:
    if _state["begun"]:
        return
    _state["begun"] = True
    for callback in list(_callbacks):
        try:
            callback()
        except Exception:  # one failing callback must not keep the others from ending their work
            log.exception("a shutdown callback failed")

