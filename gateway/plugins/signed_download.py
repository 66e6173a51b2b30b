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
from gateway.context import Handler, RequestContext
from gateway.plugins.base import PluginBase, RouteInfo, Settings
from gateway.response import GatewayResponse
from gateway.services import Services

MEMO_ENTRIES = 4096


class SignedDownloadSettings(Settings):
    action: Literal["sign", "verify"]
    path: str = DOWNLOAD_PATH
    param: str = "task_id"


class SignedDownload(PluginBase[SignedDownloadSettings]):
    name: ClassVar[str] = "signed_download"
    Settings: ClassVar[type[SignedDownloadSettings]] = SignedDownloadSettings

    def __init__(self, next: Handler, settings: SignedDownloadSettings, services: Services,
                 route: RouteInfo) -> None:
        super().__init__(next, settings, services, route)
        # (link base, task id, result expiry) -> signed link, for links whose expiry is the result's own (not
        # cut by the signer's cap, which moves with the clock): a client polling its list gets the same links
        self._links: dict[tuple[str, str, str], str] = {}

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        if self.settings.action == "verify":
            self._verify(ctx)
            return await self.next(ctx)
        resp = await self.next(ctx)
        doc = await resp.json() if resp.status in (200, 409) else None
        data = doc.get("data") if isinstance(doc, dict) else None
        if isinstance(data, dict):
            base = self.services.trusted_proxies.link_base(ctx.request.scope, self.services.public_base_url)
            items = data.get("items")
            tasks = items if isinstance(items, list) else [data]
            if sum(self._sign(task, base) for task in tasks):
                resp.replace_json(doc)
        return resp

    def _sign(self, task: Any, base: str) -> bool:
        result = task.get("result") if isinstance(task, dict) else None
        if not isinstance(result, dict) or not result.get("download_url") or not result.get("expire_at"):
            return False
        task_id, expire_at = task["task_id"], result["expire_at"]
        if type(task_id) is str and type(expire_at) is str:
            result["download_url"] = self._link(base, task_id, expire_at)
        else:
            result["download_url"] = signed_link(self.services.signer, base, task_id, parse_rfc3339(expire_at),
                                                 self.settings.path)
        return True

    def _link(self, base: str, task_id: str, expire_at: str) -> str:
        key = (base, task_id, expire_at)
        link = self._links.get(key)
        if link is None:
            signer, result_expires = self.services.signer, parse_rfc3339(expire_at)
            link = signed_link(signer, base, task_id, result_expires, self.settings.path)
            if signer.expiry(result_expires) == int(result_expires):
                if len(self._links) >= MEMO_ENTRIES:
                    self._links.clear()
                self._links[key] = link
        return link

    def _verify(self, ctx: RequestContext) -> None:
        expires, sig = link_params(ctx.request.query_params.multi_items())
        task_id = ctx.params.get(self.settings.param, "")
        if expires is None or sig is None or not self.services.signer.verify(task_id, expires, sig):
            raise ApiError(ErrorKind.BAD_SIGNATURE)
        if expires < time.time():
            raise ApiError(ErrorKind.GONE)
        ctx.query = ""

