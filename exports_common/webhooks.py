"""Signing and verifying callbacks after the Standard Webhooks scheme, with the `standardwebhooks` package.

The sender puts `webhook-id`, `webhook-timestamp` and `webhook-signature` on each
request; the signature is `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`
with the tenant's `whsec_` secret, one entry per secret while secrets rotate.
A client verifies with `verify(...)` (or the SDK's `verify_webhook`).
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime

from standardwebhooks import Webhook, WebhookVerificationError

MAX_TIMESTAMP_DIGITS = 12  # Unix seconds until the year 33658


def sign(secrets: list[str], msg_id: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """The three headers for one delivery attempt (`body` is UTF-8: the backend's JSON)."""
    ts = int(time.time()) if timestamp is None else timestamp
    when, text = datetime.fromtimestamp(ts, UTC), body.decode()
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": " ".join(Webhook(s).sign(msg_id, when, text) for s in secrets),
    }


def verify(secret: str, headers: Mapping[str, str], body: bytes) -> bool:
    """True when one of the signatures is `secret`'s and the timestamp within 5 minutes (replays are refused)."""
    webhook = Webhook(secret)
    lower = {k.lower(): v for k, v in headers.items()}
    # unauthenticated input: 1 to 12 ASCII digits only (the library's float() also takes "+1_0", "1e9", " 17...",
    # other scripts' digits and fractions, which no sender writes)
    stamp = lower.get("webhook-timestamp", "")
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= MAX_TIMESTAMP_DIGITS):
        return False
    try:
        webhook.verify(body, lower, json_parse=False)
    # ValueError: a signature entry that is not `version,base64`, or a body that is not UTF-8 (the library lets
    # both through as they are); unauthenticated input, so a refusal
    except (WebhookVerificationError, ValueError):
        return False
    return True
