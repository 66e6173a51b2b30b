"""Signing and verifying callbacks after the Standard Webhooks scheme.

The sender puts `webhook-id`, `webhook-timestamp` and `webhook-signature` on each
request; the signature is `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`
with the tenant's `whsec_` secret, one entry per secret while secrets rotate.
A client verifies with `verify(...)`; this module needs nothing but the standard
library, so it can be copied into a client as it is (docs/clients/webhooks.md).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import Mapping


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix("whsec_"))


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(_key(secret), f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def sign(secrets: list[str], msg_id: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """The three headers for one delivery attempt."""
    ts = int(time.time()) if timestamp is None else timestamp
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": " ".join(signature(s, msg_id, ts, body) for s in secrets),
    }


def verify(secret: str, headers: Mapping[str, str], body: bytes, tolerance_sec: int = 300,
           now: float | None = None) -> bool:
    """True when one of the signatures is `secret`'s and the timestamp is recent (replays are refused)."""
    try:
        msg_id, stamp = headers["webhook-id"], headers["webhook-timestamp"]
        offered = headers["webhook-signature"].split()
    except KeyError:
        return False
    # unauthenticated input: at most 12 ASCII digits (a longer number cannot be subtracted from a float:
    # OverflowError)
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= 12):
        return False
    ts = int(stamp)
    if abs((time.time() if now is None else now) - ts) > tolerance_sec:
        return False
    expected = signature(secret, msg_id, ts, body)
    return any(hmac.compare_digest(expected, candidate) for candidate in offered)
