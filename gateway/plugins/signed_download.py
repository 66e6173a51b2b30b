"""signed_download: result links point at the gateway, signed and expiring with the result.

`sign` rewrites `result.download_url` in task answers (single task or list) into
the contract's signed link (`exports_common.contract.signed_link`). `verify` (on the download route)
answers 403 for a missing or wrong signature or an expiry beyond
`download_signing.max_link_ttl_sec` from now, and 410 past the expiry, before any
upstream call; the file then streams from the upstream, Range requests included.
"""
from __future__ import annotations

import time
from typing import Any, ClassVar, Literal

from exports_common.contract import DOWNLOAD_PATH, link_params, signed_link
from exports_common.errors import ApiError, ErrorKind
from exports_common.timefmt import parse_rfc3339
from gateway.context import RequestContext
from gateway.plugins.base import Contract, PluginBase, Settings
from gateway.response import GatewayResponse


class SignedDownloadSettings(Settings):
    action: Literal["sign", "verify"]
    path: str = DOWNLOAD_PATH
    param: str = "task_id"


class SignedDownload(PluginBase[SignedDownloadSettings]):
    name: ClassVar[str] = "signed_download"
    Settings: ClassVar[type[SignedDownloadSettings]] = SignedDownloadSettings
    provides: ClassVar[frozenset[str]] = frozenset({"query"})  # verify only: `contract` says which use

    @classmethod
    def contract(cls, settings: SignedDownloadSettings, methods: tuple[str, ...]) -> Contract:
        # verify sends the download upstream without the link's query: `expires` and `sig` are the gateway's,
        # and a signature in the upstream's access log would be a link anyone reading the log could use
        return Contract(provides=cls.provides if settings.action == "verify" else frozenset())

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        if self.settings.action == "verify":
            self._verify(ctx)
            return await self.next(ctx)
        resp = await self.next(ctx)
        doc = await resp.json() if resp.status in (200, 409) else None
        data = doc.get("data") if isinstance(doc, dict) else None
        if isinstance(data, dict):
            base = self.services.trusted_proxies.link_base(ctx.scope, self.services.public_base_url)
            items = data.get("items")
            tasks = items if isinstance(items, list) else [data]
            if sum(self._sign(task, base) for task in tasks):
                resp.replace_json(doc)
        return resp

    def _sign(self, task: Any, base: str) -> bool:
        result = task.get("result") if isinstance(task, dict) else None
        if not isinstance(result, dict) or not result.get("download_url") or not result.get("expire_at"):
            return False
        result["download_url"] = signed_link(self.services.signer, base, task["task_id"],
                                             parse_rfc3339(result["expire_at"]), self.settings.path)
        return True

    def _verify(self, ctx: RequestContext) -> None:
        expires, sig = link_params(ctx.request.query_params.multi_items())
        task_id = ctx.params.get(self.settings.param, "")
        if expires is None or sig is None or not self.services.signer.verify(task_id, expires, sig):
            raise ApiError(ErrorKind.BAD_SIGNATURE)
        if expires < time.time():
            raise ApiError(ErrorKind.GONE)
        ctx.query = ""  # the link's own parameters stay at the edge

