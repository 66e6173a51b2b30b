"""Which forwarding headers to believe: only those a configured trusted proxy sent.

Anyone can send `Forwarded`, `X-Forwarded-*` or `X-Real-IP`. From a peer outside
`trusted_proxies` they are dropped before the upstream, and never shape a link:
links take their base from `public_base_url` (required outside dev mode), else
from a trusted proxy's forwarded host, else from the address the gateway listens on.
"""
from __future__ import annotations

import ipaddress
from typing import Literal

from starlette.types import Scope

from exports_common.connection_limits import networks

# forwarding headers: these names, and any name with this prefix (lower-cased, `_` read as `-`)
FORWARDING = frozenset({"forwarded", "x-real-ip"})
FORWARDING_PREFIX = "x-forwarded-"


ForwardedHeader = Literal["auto", "x-forwarded-for", "forwarded"]


class TrustedProxies:
    def __init__(self, cidrs: list[str] | None = None, header: ForwardedHeader = "auto") -> None:
        """`header`: the one the nearest trusted proxy writes the client's address in (auto: either, not both)."""
        self.networks = tuple(networks(cidrs or []))
        self.header = header

    def trusts(self, scope: Scope) -> bool:
        client = scope.get("client")
        nets = self.networks
        if not client or not nets:
            return False
        try:
            address = ipaddress.ip_address(client[0])
        except ValueError:
            return False
        return any(address in net for net in nets)

    def link_base(self, scope: Scope, public_base_url: str) -> str:
        if public_base_url:
            return public_base_url
        if self.trusts(scope):
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            host = headers.get("x-forwarded-host", "").split(",")[0].strip()
            proto = headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
            if host and _plain_host(host) and proto in ("http", "https"):
                return f"{proto}://{host}"
        server = scope.get("server") or ("127.0.0.1", 80)
        host = f"[{server[0]}]" if ":" in str(server[0]) else str(server[0])
        return f"{scope.get('scheme', 'http')}://{host}:{server[1]}"


def _plain_host(host: str) -> bool:
    return all(c.isalnum() or c in ".-:[]" for c in host)
