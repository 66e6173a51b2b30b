"""signed_download: result links point at the gateway, signed and expiring with the result.

`sign` rewrites `result.download_url` in task answers (single task or list) into
`<public base><path>?expires=<unix>&sig=<hmac>`. `verify` (on the download route)
answers 403 for a missing or wrong signature or an expiry beyond
`download_signing.max_link_ttl_sec` from now, and 410 past the expiry, before any
upstream call; the file then streams from the upstream, Range requests included.
"""
from __future__ import annotations

import re
import time
from typing import Any, ClassVar, Literal

from exports_common.errors import ApiError, ErrorKind
from exports_common.timefmt import parse_rfc3339
from gateway.context import RequestContext
from gateway.plugins.base import PluginBase, Settings
from gateway.response import GatewayResponse

_EXPIRES = re.compile(r"[0-9]{1,12}")  # unix seconds: 12 digits reach the year 33658


class SignedDownloadSettings(Settings):
    action: Literal["sign", "verify"]
    path: str = "/api/v1/exports/{task_id}/download"
    param: str = "task_id"


class SignedDownload(PluginBase[SignedDownloadSettings]):
    name: ClassVar[str] = "signed_download"
    Settings: ClassVar[type[SignedDownloadSettings]] = SignedDownloadSettings

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
        task_id = task["task_id"]
        expires = self.services.signer.expiry(parse_rfc3339(result["expire_at"]))
        sig = self.services.signer.sign(task_id, expires)
        result["download_url"] = f"{base}{self.settings.path.format(task_id=task_id)}?expires={expires}&sig={sig}"
        return True

    def _verify(self, ctx: RequestContext) -> None:
        expires, sig = _link_params(ctx.request.query_params.multi_items())
        task_id = ctx.params.get(self.settings.param, "")
        if expires is None or sig is None or not self.services.signer.verify(task_id, expires, sig):
            raise ApiError(ErrorKind.BAD_SIGNATURE)
        if expires < time.time():
            raise ApiError(ErrorKind.GONE)
        ctx.query = ""


def _link_params(params: list[tuple[str, str]]) -> tuple[int | None, str | None]:
    """`expires` (ASCII digits, at most 12) and `sig`, each given once; None for anything else.

    Every malformed link is the same 403 as a wrong signature: the link is the credential.
    """
    found: dict[str, list[str]] = {}
    for name, value in params:
        found.setdefault(name, []).append(value)
    expires, sig = found.get("expires", []), found.get("sig", [])
    ok_expires = len(expires) == 1 and _EXPIRES.fullmatch(expires[0]) is not None
    return (int(expires[0]) if ok_expires else None), (sig[0] if len(sig) == 1 else None)
