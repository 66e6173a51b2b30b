"""The headers a request sends upstream, and the upstream's headers a client gets back.

Hop-by-hop headers are dropped both ways. The headers the upstream trusts
(tenant, task id, attempt) come only from the request context, never from the
client; forwarding headers only from a trusted proxy. A plugin that stores a
request to send later (outbox) takes its headers from here, as the proxy does.
"""
from __future__ import annotations

from gateway import telemetry
from gateway.context import RequestContext
from gateway.forwarding import TrustedProxies, is_forwarding

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length",
})
# set by the gateway alone; a client's copy is dropped
GATEWAY_OWNED = frozenset({
    "x-tenant-id", "x-task-id", "x-gateway-attempt", "x-request-id", "authorization", "traceparent", "tracestate",
    "x-tenant-max-active-tasks",
})


def _dropped(headers: list[tuple[str, str]], extra: frozenset[str]) -> set[str]:
    named = {t.strip().lower() for k, v in headers if k == "connection" for t in v.split(",")}
    return set(HOP_BY_HOP) | named | set(extra)


def upstream_headers(ctx: RequestContext, trusted: TrustedProxies) -> list[tuple[str, str]]:
    """The client's headers minus hop-by-hop, gateway-owned and (from an untrusted peer) forwarding ones.

    A name is judged with `_` read as `-`: servers such as uvicorn and WSGI ones fold
    `X_Tenant_Id` into `X-Tenant-Id`, so a client's underscore spelling must not slip by.
    """
    scope = ctx.request.scope
    incoming = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]]
    # a header the context sets replaces the client's (a call of the gateway's own sets its content-type)
    drop = _dropped(incoming, GATEWAY_OWNED) | ctx.upstream_headers.keys()
    from_proxy = trusted.trusts(scope)
    out, chain = [], ""
    for key, value in incoming:
        name = key.replace("_", "-")
        if name in drop or (is_forwarding(name) and not from_proxy):
            continue
        if name == "x-forwarded-for":
            chain = f"{value}, "
            continue
        out.append((key, value))
    client = ctx.request.client
    out += [
        ("x-forwarded-for", chain + (client.host if client else "")),
        ("x-request-id", ctx.request_id),
    ]
    if not from_proxy:
        out += [("x-forwarded-proto", scope.get("scheme", "http")),
                ("x-forwarded-host", ctx.request.headers.get("host", ""))]
    out += list(ctx.upstream_headers.items())
    carrier: dict[str, str] = {}
    telemetry.inject(carrier)
    out += list(carrier.items())
    return out


def client_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    # the gateway's own server adds date and server
    drop = (_dropped(headers, frozenset({"date", "server"}))) - {"content-length"}
    return [(k, v) for k, v in headers if k not in drop]
