"""Which callback addresses may be called: public ones, and whatever the config allow-lists.

Checked at submit (gateway) and again at every delivery (backend), because a name
can resolve differently later. The delivery connects only to an address this
module approved (`PinnedResolver`): the name is resolved once, each address is
judged, and the connection goes to an approved one, so a second lookup that
answers differently (DNS rebinding) has nothing to act on. IP literals in any
spelling (decimal, octal, shortened) and IPv4 carried inside IPv6 (mapped,
compatible, translated, NAT64, 6to4, Teredo) are reduced to the address they reach before
they are judged.
"""
from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = (ipaddress.IPv6Network("64:ff9b::/96"), ipaddress.IPv6Network("64:ff9b:1::/48"))
_6TO4 = ipaddress.IPv6Network("2002::/16")
_TEREDO = ipaddress.IPv6Network("2001::/32")
_COMPATIBLE = ipaddress.IPv6Network("::/96")
_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")  # IPv4-translated, ::ffff:0:a.b.c.d (RFC 2765 SIIT)
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


class RefusedAddress(OSError):
    """The name resolved only to addresses the policy refuses (an OSError, so clients treat it as a connect failure)."""


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries and routes to, in any of the standard embeddings."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in _TRANSLATED:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _COMPATIBLE and int(ip) > 1:  # ::a.b.c.d (deprecated, still routed by some stacks); not :: or ::1
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if any(ip in net for net in _NAT64):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _6TO4:
        return ip.sixtofour
    if ip in _TEREDO:
        return ip.teredo[1] if ip.teredo else None  # (server, client): the client is where traffic goes
    return None


@dataclass(frozen=True)
class AddressPolicy:
    allow_hosts: frozenset[str] = frozenset()
    allow_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = field(default_factory=tuple)

    @classmethod
    def from_lists(cls, hosts: list[str], networks: list[str]) -> AddressPolicy:
        return cls(frozenset(h.lower() for h in hosts), tuple(ipaddress.ip_network(n, strict=False) for n in networks))

    def address_allowed(self, ip: IPAddress) -> bool:
        if any(ip in net for net in self.allow_networks):
            return True
        inner = embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
        if inner is not None:  # judged as where it goes: public only if that IPv4 address is
            return self.address_allowed(inner)
        return ip.is_global and not ip.is_multicast


def literal_address(host: str) -> IPAddress | None:
    """The address a host names literally, in any spelling a resolver would accept, else None."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    try:
        # inet_aton accepts the legacy forms: 2130706433, 0x7f.1, 0177.0.0.1, 127.1
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except (OSError, ValueError):  # ValueError: an embedded NUL
        return None


def host_name_problem(host: str) -> str | None:
    """Why `host` is neither an IP literal nor a DNS name (IDNA, labels of 1-63, at most 253), or None."""
    if literal_address(host) is not None:
        return None
    try:
        ascii_name = host.rstrip(".").encode("idna").decode("ascii").lower()
    except UnicodeError:
        return "the host name is not a valid internationalised (IDNA) name"
    labels = ascii_name.split(".")
    if not ascii_name or len(ascii_name) > 253 or not all(_LABEL.match(label) for label in labels):
        return "the host name is not a valid DNS name (labels of 1 to 63 letters, digits or hyphens, 253 at most)"
    return None


async def refusal(url: str, policy: AddressPolicy, resolve: bool = True) -> str | None:
    """Why the URL may not be called, or None when it may."""
    try:
        host = (urlsplit(url).hostname or "").lower()
    except ValueError:
        return "the URL cannot be parsed"
    if not host:
        return "the URL has no host"
    if problem := host_name_problem(host):
        return problem
    if host in policy.allow_hosts:
        return None
    literal = literal_address(host)
    if literal is not None:
        return None if policy.address_allowed(literal) else f"{host} is not a public address"
    if not resolve:
        return None
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return None  # unresolvable now: the deliverer checks again when it calls
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if not policy.address_allowed(ip):
            return f"{host} resolves to {ip}, which is not a public address"
    return None


class PinnedResolver(AbstractResolver):
    """An aiohttp resolver that answers only addresses the policy allows, so the connection goes to one of them.

    aiohttp keeps the name for the Host header and TLS (SNI and certificate check);
    only the address it dials comes from here. Give the connector
    `use_dns_cache=False` so every connection is judged on a fresh answer.
    """

    def __init__(self, policy: AddressPolicy) -> None:
        self.policy = policy

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET,
                      ) -> list[ResolveResult]:
        if problem := host_name_problem(host):
            raise RefusedAddress(problem)
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM, family=family)
        allowed: list[ResolveResult] = []
        refused: list[str] = []
        for fam, _, proto, _, sockaddr in infos:
            address = str(sockaddr[0])
            ip = ipaddress.ip_address(address.split("%", 1)[0])
            if host.lower() in self.policy.allow_hosts or self.policy.address_allowed(ip):
                allowed.append(_result(host, address, int(sockaddr[1]), fam, proto))
            else:
                refused.append(address)
        if not allowed:
            raise RefusedAddress(f"{host} resolves to {', '.join(refused) or 'nothing'}, "
                                 f"which is not a public address")
        return allowed

    async def close(self) -> None:
        return None


def _result(host: str, address: str, port: int, family: Any, proto: int) -> ResolveResult:
    return ResolveResult(hostname=host, host=address, port=port, family=family, proto=proto,
                         flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV)
