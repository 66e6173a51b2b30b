"""Dev mode, and the secrets this repository publishes (config defaults, README, `make run`).

Anyone can read them, so outside dev mode both processes refuse to start with any
of them in force, and with no public URL for their links. Dev mode is `--dev` on
`run` or EXPORTS_DEV=1; `make run` turns it on and says so.
"""
from __future__ import annotations

import hashlib
import os

DEV_ENV = "EXPORTS_DEV"
DEV_ADMIN_TOKEN = "admin-change-me"
DEV_SIGNING_SECRET = "dev-signing-secret-change-me"
DEMO_API_KEYS = {"demo": "demo-key-change-me", "demo2": "demo2-key-change-me"}
DEV_WEBHOOK_SECRETS = frozenset({"whsec_iCl0WN940QaVoCJovUTAq++Q04VVO3U5", "whsec_H5dBebRJnn8aiSa6bctI1Ge4mSV9g9vM"})
# where `make run` serves the gateway: the link base of a dev stack started without GATEWAY_PUBLIC_URL
DEV_PUBLIC_URL = "http://127.0.0.1:8080"
DEMO_KEY_HASHES = frozenset("sha256:" + hashlib.sha256(k.encode()).hexdigest() for k in DEMO_API_KEYS.values())


def dev_mode() -> bool:
    return os.environ.get(DEV_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def enable_dev_mode() -> None:
    # the environment, so that a config reload in this process judges by the same mode
    os.environ[DEV_ENV] = "1"


def refusal(problems: list[str]) -> str:
    return "\n".join(
        ["refusing to start: the config uses values published with this project or lacks a public URL"]
        + [f"  - {p}" for p in problems]
        + ["set them as named above; for a local trial only, start in dev mode (--dev or EXPORTS_DEV=1)"])
