"""The one place that decides a request's client address (what per-address limits count).

From a peer that is not a trusted proxy, the socket peer's address. Behind trusted
proxies (`trusted_proxies`), each proxy appends the address it saw to
`X-Forwarded-For` (or `Forwarded: for=`), and a client may have sent any list of its
own before them: the chain is walked from the right, past every trusted proxy, and the
first address that is not one is the client's. Everything left of it is the client's
word and never counts, so anonymous clients behind one proxy each get their own
bucket, and none can spend another's.

`Forwarded` is read by its grammar (gateway.forwarded_header). A malformed element, and
every element left of it, is ignored: those on its right were written after it, by the
proxies nearer this gateway, and are read as they are; but a quote the client never closed
may have swallowed a proxy's element, and the client's own element next to the gap must not
become the rightmost hop. With nothing readable left, a trusted peer's own address counts.
"""
from __future__ import annotations

import ipaddress
from collections import deque

from starlette.types import Scope

from gateway.forwarded_header import elements
from gateway.forwarding import TrustedProxies

MAX_CHAIN = 64  # entries looked at, from the right: a proxy chain is a few hops, a longer list is the client's


def _host(value: str) -> str:
    """An address as a forwarding header writes it: quotes, `[v6]` brackets and a `:port` taken off."""
    value = value.strip().strip('"')
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:  # v4 with a port (a bare v6 address has several colons)
        return value.split(":", 1)[0]
    return value


def _forwarded_for(lines: list[str]) -> list[str]:
    """The `for=` values of Forwarded's field lines, in order, the last MAX_CHAIN after the last malformed element."""
    hops: deque[str] = deque(maxlen=MAX_CHAIN)
    for line in lines:
        for element in elements(line):
            if element is None:
                hops.clear()
            elif element.get("for"):
                hops.append(element["for"])
    return list(hops)


def forwarded_chain(scope: Scope) -> list[str]:
    """The addresses of X-Forwarded-For (every such header, in order), else of Forwarded's `for=` parameters."""
    xff: list[str] = []
    forwarded: list[str] = []
    for key, value in scope["headers"]:
        if key == b"x-forwarded-for":
            xff += [part for part in value.decode("latin-1").split(",") if part.strip()]
        elif key == b"forwarded":
            forwarded.append(value.decode("latin-1"))
    return [_host(part) for part in (xff or _forwarded_for(forwarded))[-MAX_CHAIN:]]


def _trusted(address: str, trusted: TrustedProxies) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in trusted.networks)


def client_address(scope: Scope, trusted: TrustedProxies) -> str:
    """The client's address: the peer's, or behind trusted proxies the first untrusted one from the right."""
    client = scope.get("client")
    peer = str(client[0]) if client else "unknown"
    if not trusted.trusts(scope):
        return peer
    chain = forwarded_chain(scope)
    for address in reversed(chain):
        if not _trusted(address, trusted):
            return address[:64] or "unknown"
    return chain[0][:64] if chain else peer  # every hop a trusted proxy: the first one is the nearest we know
