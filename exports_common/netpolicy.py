"""Which callback addresses may be called: public ones, and whatever the config allow-lists.

Checked at submit (gateway) and again before every delivery (backend), because a
name can resolve differently later. IP literals in any spelling (decimal, octal,
shortened, IPv4-mapped IPv6) are normalised before they are judged.
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class AddressPolicy:
    allow_hosts: frozenset[str] = frozenset()
    allow_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = field(default_factory=tuple)

    @classmethod
    def from_lists(cls, hosts: list[str], networks: list[str]) -> AddressPolicy:
        return cls(frozenset(h.lower() for h in hosts), tuple(ipaddress.ip_network(n, strict=False) for n in networks))

    def address_allowed(self, ip: IPAddress) -> bool:
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in net for net in self.allow_networks):
            return True
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
    except OSError:
        return None


async def refusal(url: str, policy: AddressPolicy, resolve: bool = True) -> str | None:
    """Why the URL may not be called, or None when it may."""
    try:
        host = (urlsplit(url).hostname or "").lower()
    except ValueError:
        return "the URL cannot be parsed"
    if not host:
        return "the URL has no host"
    if host in policy.allow_hosts:
        return None
    literal = literal_address(host)
    if literal is not None:
        return None if policy.address_allowed(literal) else f"{host} is not a public address"
    if not resolve:
        return None
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None  # unresolvable now: the deliverer checks again when it calls
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if not policy.address_allowed(ip):
            return f"{host} resolves to {ip}, which is not a public address"
    return None
