"""An in-process harness for plugin authors: one route's chain on the gateway's own request path.

    from gateway.testing import PluginHarness

    async def test_only_acme_gets_through() -> None:
        async with PluginHarness(["auth", {"tenant_allowlist": {"tenants": ["acme"]}}],
                                 tenants={"acme": "key-a", "globex": "key-g"}) as gw:
            assert (await gw.request("GET", "/test/x", api_key="key-a")).status == 200
            refused = await gw.request("GET", "/test/x", api_key="key-g")
            assert refused.status == 404 and refused.upstream is None

The plugin list is the route's `plugins` as written in gateway.yaml, and `policy` its
`policy:` (timeout, retry, and `circuit_breaker: {scope: route}` for a breaker of its
own), validated as check-config validates them (a mistake raises ConfigError with the
same messages), and built into the same chain by the same code. The chain ends in
the route's upstream call around `upstream`: by default a recorder that answers 200
with what reached it; a URL string sends the requests through the real proxy to a
real server instead. Each answer passes through
the gateway's dispatch, so an ApiError becomes the error envelope a client would get.
No process, socket or Redis is started; state lives in memory and a temporary directory.
"""
from __future__ import annotations

import dataclasses
import json
import tempfile
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Mapping, Sequence

from starlette.requests import Request
from starlette.types import Message

from exports_common.config_loader import validate_data
from gateway import dispatch
from gateway.config import GatewayConfig
from gateway.context import Handler, RequestContext
from gateway.response import GatewayResponse
from gateway.runtime import Runtime, build_chain, build_runtime
from gateway.services import Services
from gateway.tenants import hash_key
from gateway.wiring import open_services

ROUTE = "test"


@dataclass
class Recorder:
    """The default end of the chain: keeps each context that reached it and answers 200 with its gist."""

    seen: list[RequestContext] = field(default_factory=list)

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        self.seen.append(ctx)
        return GatewayResponse.envelope({"method": ctx.method, "path": ctx.upstream_path, "query": ctx.query,
                                         "tenant": ctx.tenant, "headers": ctx.upstream_headers})


@dataclass
class Exchange:
    """One request's answer, and the context that reached the upstream (None: the chain answered by itself)."""

    status: int
    headers: dict[str, str]
    body: bytes
    upstream: RequestContext | None

    def json(self) -> Any:
        return json.loads(self.body)


class PluginHarness:
    def __init__(self, plugins: Sequence[Any], *, tenants: Mapping[str, str] | None = None,
                 upstream: Handler | str | None = None, path: str = "/test/{rest}",
                 methods: Sequence[str] = ("GET", "POST", "PUT", "DELETE"), rewrite: str | None = None,
                 config: Mapping[str, Any] | None = None, policy: Mapping[str, Any] | None = None) -> None:
        """`plugins` and `policy` as in a route's YAML; `tenants` maps a tenant to its API key; `config` adds
        top-level keys."""
        self._state = tempfile.TemporaryDirectory(prefix="plugin-harness-")
        self.recorder = upstream if isinstance(upstream, Recorder) else Recorder()
        self._last: Handler | None = None if isinstance(upstream, str) else (upstream or self.recorder)
        route = {"name": ROUTE, "path": path, "methods": list(methods), "upstream": "upstream",
                 "rewrite": rewrite, "plugins": list(plugins), "policy": dict(policy or {})}
        self.config = validate_data({
            "admin_token": "plugin-harness", "download_signing": {"secrets": ["plugin-harness-signing"]},
            "public_base_url": "http://gateway.test", "state_dir": self._state.name,
            "upstreams": {"upstream": {"url": upstream if isinstance(upstream, str) else "http://127.0.0.1:9"}},
            "tenants": {t: {"api_key_hashes": [hash_key(key)]} for t, key in (tenants or {}).items()},
            "routes": [route], **(config or {}),
        }, GatewayConfig, "PluginHarness")
        self._runtime: Runtime | None = None

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            raise RuntimeError("use the harness inside `async with PluginHarness(...) as gw:`")
        return self._runtime

    @property
    def services(self) -> Services:
        return self.runtime.services

    async def __aenter__(self) -> PluginHarness:
        runtime = build_runtime(self.config, open_services(self.config))
        if self._last is not None:
            route = self.config.routes[0]
            chain = build_chain(route, self.config.breaker_of(route), runtime.services, self._last)
            runtime = dataclasses.replace(runtime, chains={ROUTE: chain})
        self._runtime = runtime
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._runtime is not None:
            await self._runtime.services.client.close()
        self._state.cleanup()

    async def request(self, method: str, path: str, *, headers: Mapping[str, str] | None = None,
                      body: bytes = b"", json_body: Any = None, api_key: str | None = None,
                      client: str = "127.0.0.1") -> Exchange:
        """Send one request from `client`'s address; `api_key` adds `Authorization: Bearer <key>`."""
        sent = {k.lower(): v for k, v in (headers or {}).items()}
        if json_body is not None:
            body = json.dumps(json_body).encode()
            sent.setdefault("content-type", "application/json")
        if api_key is not None:
            sent["authorization"] = f"Bearer {api_key}"
        if body:
            sent["content-length"] = str(len(body))
        seen = len(self.recorder.seen)
        request = _request(method, path, sent, body, client)
        resp = await dispatch.handle(self.runtime, request.scope, request.receive)
        content = await resp.read()
        reached = self.recorder.seen[seen] if len(self.recorder.seen) > seen else None
        return Exchange(resp.status, dict(resp.headers), content, reached)


def _request(method: str, target: str, headers: dict[str, str], body: bytes, client: str) -> Request:
    path, _, query = target.partition("?")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method.upper(),
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
        "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()],
        "client": (client, 40000), "server": ("gateway.test", 80),
    }
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)
