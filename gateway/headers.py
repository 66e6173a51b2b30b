"""The headers a request sends upstream, and the upstream's headers a client gets back.

Hop-by-hop headers are dropped both ways. The headers the upstream trusts
(tenant, task id, attempt) come only from the request context, never from the
client; forwarding headers only from a trusted proxy. A plugin that stores a
request to send later (outbox) takes its headers from here, as the proxy does.
"""
from __future__ import annotations

from gateway import telemetry
from gateway.context import RequestContext
from gateway.forwarding import FORWARDING, FORWARDING_PREFIX, TrustedProxies

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length",
})
# set by the gateway alone; a client's copy is dropped
GATEWAY_OWNED = frozenset({
    "x-tenant-id", "x-task-id", "x-gateway-attempt", "x-request-id", "authorization", "traceparent", "tracestate",
    "x-tenant-max-active-tasks",
})


_DROPPED_UPSTREAM = HOP_BY_HOP | GATEWAY_OWNED
# the gateway's own server adds date and server; the upstream's content-length stays (a streamed body keeps it)
_DROPPED_CLIENT = (HOP_BY_HOP | {"date", "server"}) - {"content-length"}


def _dropped(headers: list[tuple[str, str]], always: frozenset[str]) -> frozenset[str]:
    """`always`, plus the names a `Connection` header lists (hop-by-hop too); most requests have none."""
    named = {t.strip().lower() for k, v in headers if k == "connection" for t in v.split(",")}
    return always | named if named else always


def upstream_headers(ctx: RequestContext, trusted: TrustedProxies) -> list[tuple[str, str]]:
    """The client's headers minus hop-by-hop, gateway-owned and (from an untrusted peer) forwarding ones.

    A name is judged with `_` read as `-`: servers such as uvicorn and WSGI ones fold
    `X_Tenant_Id` into `X-Tenant-Id`, so a client's underscore spelling must not slip by.
    """
    scope = ctx.scope
    incoming = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]]
    drop = _dropped(incoming, _DROPPED_UPSTREAM)
    # a header the context sets replaces the client's (a call of the gateway's own sets its content-type)
    own = ctx.upstream_headers
    from_proxy = trusted.trusts(scope)
    out, chain, host = [], "", None
    for key, value in incoming:
        name = key.replace("_", "-")
        if name in drop or name in own:
            if host is None and name == "host":
                host = value
            continue
        if not from_proxy and (name in FORWARDING or name.startswith(FORWARDING_PREFIX)):
            continue
        if name == "x-forwarded-for":
            chain = f"{value}, "
            continue
        out.append((key, value))
    client = scope.get("client")
    out += [
        ("x-forwarded-for", chain + (client[0] if client else "")),
        ("x-request-id", ctx.request_id),
    ]
    if not from_proxy:
        out += [("x-forwarded-proto", scope.get("scheme", "http")),
                ("x-forwarded-host", host or "")]
    out += own.items()
    carrier: dict[str, str] = {}
    telemetry.inject(carrier)
    out += carrier.items()
    return out


def client_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    drop = _dropped(headers, _DROPPED_CLIENT)
    if "content-length" in drop:  # named by the upstream's Connection header: it still describes the body
        drop = drop - {"content-length"}
    return [(k, v) for k, v in headers if k not in drop]
