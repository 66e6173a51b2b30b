"""Signed download links: HMAC-SHA256 over the task id and the expiry, with rotation.

The first secret signs; every listed secret verifies, so a new secret can be put
first while links signed with the old one keep working until they expire.
No link lives longer than `max_ttl_sec`: one signed to expire later is refused, so
even a leaked secret cannot mint a link that works for years.
"""
from __future__ import annotations

import hmac
import re
import time

_HEX_SHA256 = re.compile(r"^[0-9a-f]{64}$")
DEFAULT_MAX_TTL_SEC = 259_200  # the longest a result is kept (72 h)


class DownloadSigner:
    def __init__(self, secrets: list[str], max_ttl_sec: int = DEFAULT_MAX_TTL_SEC) -> None:
        if not secrets:
            raise ValueError("at least one download signing secret is needed")
        # each key's HMAC prepared once and copied per link, not set up again for each
        self._macs = [hmac.new(s.encode(), digestmod="sha256") for s in secrets]
        self.max_ttl_sec = max_ttl_sec

    def expiry(self, result_expires: float) -> int:
        """A link's expiry for a result kept until `result_expires`: no later than the cap allows."""
        return min(int(result_expires), int(time.time()) + self.max_ttl_sec)

    @staticmethod
    def _mac(prepared: hmac.HMAC, task_id: str, expires: int) -> str:
        mac = prepared.copy()
        mac.update(f"{task_id}:{expires}".encode())
        return mac.hexdigest()

    def sign(self, task_id: str, expires: int) -> str:
        return self._mac(self._macs[0], task_id, expires)

    def verify(self, task_id: str, expires: int, signature: str) -> bool:
        if not _HEX_SHA256.match(signature) or expires > time.time() + self.max_ttl_sec:
            return False
        return any(hmac.compare_digest(self._mac(k, task_id, expires), signature) for k in self._macs)
