"""Checking a callback before trusting it (Standard Webhooks, as the `standardwebhooks` package does)."""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

from exports_client.errors import WebhookVerificationError

TOLERANCE_SEC = 300
MAX_TIMESTAMP_DIGITS = 12  # Unix seconds until the year 33658


def _key(secret: str) -> bytes:
    try:
        key = base64.b64decode(secret.removeprefix("whsec_") + "==")
    except (binascii.Error, ValueError) as exc:
        raise WebhookVerificationError("the secret is not 'whsec_' and base64") from exc
    if not key:
        raise WebhookVerificationError("the secret is empty")
    return key


def verify_webhook(secret: str, headers: Mapping[str, str], body: bytes | str, *,
                   tolerance_sec: int = TOLERANCE_SEC, now: float | None = None) -> dict[str, Any]:
    """The callback's parsed JSON body once its signature and timestamp check out; else WebhookVerificationError.

    `headers` may use any case. One of the space-separated `v1,<base64>` signatures must
    be the HMAC-SHA256 of "{webhook-id}.{webhook-timestamp}.{body}" under `secret`, and
    the timestamp within `tolerance_sec` of now (older deliveries are refused as replays).
    """
    raw = body.encode() if isinstance(body, str) else body
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id, stamp, offered = (lower.get(h) for h in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    if not (msg_id and stamp and offered):
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature")
    # unauthenticated input: at most 12 ASCII digits (int() would take "+1_0", other scripts' digits, and a
    # number too large to subtract from a float, which raises OverflowError)
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= MAX_TIMESTAMP_DIGITS):
        raise WebhookVerificationError("webhook-timestamp is not a Unix time in whole seconds")
    timestamp = int(stamp)
    skew = (time.time() if now is None else now) - timestamp
    if abs(skew) > tolerance_sec:
        raise WebhookVerificationError(f"the timestamp is {abs(skew):.0f} s {'old' if skew > 0 else 'ahead'}; "
                                       f"more than {tolerance_sec} s is refused as a replay")
    expected = hmac.new(_key(secret), f"{msg_id}.{timestamp}.".encode() + raw, hashlib.sha256).digest()
    if not any(_matches(expected, candidate) for candidate in offered.split()):
        raise WebhookVerificationError("no signature matches the secret (wrong secret, or the body was changed)")
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise WebhookVerificationError("the body is not JSON") from exc
    if not isinstance(parsed, dict):
        raise WebhookVerificationError("the body is not a JSON object")
    return parsed


def _matches(expected: bytes, candidate: str) -> bool:
    version, _, signature = candidate.partition(",")
    try:
        return version == "v1" and hmac.compare_digest(expected, base64.b64decode(signature, validate=True))
    except (binascii.Error, ValueError):
        return False
