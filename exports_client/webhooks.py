"""Checking a callback before trusting it (Standard Webhooks, with the `standardwebhooks` package)."""
from __future__ import annotations

import base64
import binascii
import hmac
import json
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from standardwebhooks import Webhook
from standardwebhooks.webhooks import EmptyWebhookSecretError

from exports_client.errors import WebhookVerificationError

TOLERANCE_SEC = 300
MAX_TIMESTAMP_DIGITS = 12  # Unix seconds until the year 33658


def _webhook(secret: str) -> Webhook:
    try:
        return Webhook(secret)
    except EmptyWebhookSecretError as exc:
        raise WebhookVerificationError("the secret is empty") from exc
    except ValueError as exc:  # binascii.Error, or a str that is not ASCII
        raise WebhookVerificationError("the secret is not 'whsec_' and base64") from exc


def verify_webhook(secret: str, headers: Mapping[str, str], body: bytes | str, *,
                   tolerance_sec: int = TOLERANCE_SEC, now: float | None = None) -> dict[str, Any]:
    """The callback's parsed JSON body once its signature and timestamp check out; else WebhookVerificationError.

    `headers` may use any case. One of the space-separated `v1,<base64>` signatures must
    be the HMAC-SHA256 of "{webhook-id}.{webhook-timestamp}.{body}" under `secret`, and
    the timestamp within `tolerance_sec` of now (older deliveries are refused as replays).
    """
    webhook = _webhook(secret)
    try:
        text = body if isinstance(body, str) else body.decode()
    except UnicodeDecodeError as exc:
        raise WebhookVerificationError("the body is not UTF-8 (a callback's body is JSON)") from exc
    lower = {k.lower(): v for k, v in headers.items()}
    msg_id, stamp, offered = (lower.get(h) for h in ("webhook-id", "webhook-timestamp", "webhook-signature"))
    if not (msg_id and stamp and offered):
        raise WebhookVerificationError("missing webhook-id, webhook-timestamp or webhook-signature")
    # unauthenticated input: at most 12 ASCII digits (the library's float() would also take "+1_0", "1e9",
    # " 17...", other scripts' digits and fractions)
    if not (stamp.isascii() and stamp.isdigit() and len(stamp) <= MAX_TIMESTAMP_DIGITS):
        raise WebhookVerificationError("webhook-timestamp is not a Unix time in whole seconds")
    timestamp = int(stamp)
    # the window is checked here, not by Webhook.verify: that one is fixed at 5 minutes around the real clock,
    # and this function lets the caller choose both (`tolerance_sec`, `now`); the library signs
    skew = (time.time() if now is None else now) - timestamp
    if abs(skew) > tolerance_sec:
        raise WebhookVerificationError(f"the timestamp is {abs(skew):.0f} s {'old' if skew > 0 else 'ahead'}; "
                                       f"more than {tolerance_sec} s is refused as a replay")
    # the library's `v1,<base64>`, compared as bytes: an offered entry may be any valid base64 of them
    expected = base64.b64decode(webhook.sign(msg_id, datetime.fromtimestamp(timestamp, UTC), text).partition(",")[2])
    if not any(_matches(expected, candidate) for candidate in offered.split()):
        raise WebhookVerificationError("no signature matches the secret (wrong secret, or the body was changed)")
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise WebhookVerificationError("the body is not JSON") from exc
    if not isinstance(parsed, dict):
        raise WebhookVerificationError("the body is not a JSON object")
    return parsed


def _matches(expected: bytes, candidate: str) -> bool:
    """Whether one offered `version,base64` entry is `expected`, compared in constant time."""
    version, _, signature = candidate.partition(",")
    try:
        return version == "v1" and hmac.compare_digest(expected, base64.b64decode(signature, validate=True))
    except (binascii.Error, ValueError):
        return False
