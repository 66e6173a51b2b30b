"""The one place that decides a request's client address (what per-address limits count).

From a peer that is not a trusted proxy, the socket peer's address. Behind trusted
proxies (`trusted_proxies`), each proxy appends the address it saw to
`X-Forwarded-For` (or `Forwarded: for=`), and a client may have sent any list of its
own before them: the chain is walked from the right, past every trusted proxy, and the
first address that is not one is the client's. Everything left of it is the client's
word and never counts, so anonymous clients behind one proxy each get their own
bucket, and none can spend another's.

Which header: the one `forwarded_header` names. On `auto`, whichever one the request carries;
a request with both is believed in neither, and the trusted peer's own address counts: a
proxy appends to one of them and passes the other through as the client wrote it, so the
client would choose the address.

`Forwarded` is read by its grammar (gateway.forwarded_header), only its last
FORWARDED_TAIL characters (more than MAX_CHAIN hops' worth): a longer header is the client's
padding, and the element the cut lands in is malformed. A malformed element, or one without a
`for=` (a proxy that wrote only `proto=` or `host=`), ends the chain there: everything left of
it is ignored, those on its right were written after it by the proxies nearer this gateway. A
quote the client never closed may have swallowed a proxy's element, and the client's own
element next to the gap must not become the rightmost hop. With nothing readable left, a
trusted peer's own address counts.
"""
from __future__ import annotations

import ipaddress
from collections import deque

from starlette.types import Scope

from gateway.forwarded_header import elements
from gateway.forwarding import ForwardedHeader, TrustedProxies

MAX_CHAIN = 64  # entries looked at, from the right: a proxy chain is a few hops, a longer list is the client's
FORWARDED_TAIL = 4096  # characters of Forwarded read, from the right


def _host(value: str) -> str:
    """An address as a forwarding header writes it: quotes, `[v6]` brackets and a `:port` taken off."""
    value = value.strip().strip('"')
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:  # v4 with a port (a bare v6 address has several colons)
        return value.split(":", 1)[0]
    return value


def _forwarded_for(lines: list[str]) -> list[str]:
    """The `for=` values of Forwarded's field lines (their last FORWARDED_TAIL characters), in order, the last
    MAX_CHAIN after the last element that is malformed or names no `for`."""
    hops: deque[str] = deque(maxlen=MAX_CHAIN)
    for line in _tails(lines, FORWARDED_TAIL):
        for element in elements(line):
            if element is None or not element.get("for"):
                hops.clear()
            else:
                hops.append(element["for"])
    return list(hops)


def _tails(lines: list[str], budget: int) -> list[str]:
    """The field lines' last `budget` characters, taken from the last line back: the earlier lines' rest dropped."""
    kept: list[str] = []
    for line in reversed(lines):
        if budget <= 0:
            break
        kept.append(line[-budget:])
        budget -= len(line)
    return kept[::-1]


def forwarded_chain(scope: Scope, header: ForwardedHeader = "auto") -> list[str]:
    """The addresses of `header`'s hops (X-Forwarded-For: every such header, in order; Forwarded: its `for=`
    parameters); on auto, of whichever the request carries, and none when it carries both."""
    xff: list[str] = []
    forwarded: list[str] = []
    for key, value in scope["headers"]:
        if key == b"x-forwarded-for":
            xff += [part for part in value.decode("latin-1").split(",") if part.strip()]
        elif key == b"forwarded":
            forwarded.append(value.decode("latin-1"))
    if header == "auto" and xff and forwarded:
        return []
    hops = xff if header == "x-forwarded-for" or (header == "auto" and xff) else _forwarded_for(forwarded)
    return [_host(part) for part in hops[-MAX_CHAIN:]]


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
    chain = forwarded_chain(scope, trusted.header)
    for address in reversed(chain):
        if not _trusted(address, trusted):
            return address[:64] or "unknown"
    return chain[0][:64] if chain else peer  # every hop a trusted proxy: the first one is the nearest we know
