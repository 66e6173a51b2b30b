"""API keys to tenants. Keys are stored only as SHA-256 hashes ("sha256:<hex>")."""
from __future__ import annotations

import hashlib


def hash_key(api_key: str) -> str:
    return "sha256:" + hashlib.sha256(api_key.encode()).hexdigest()


class TenantDirectory:
    def __init__(self, key_hashes: dict[str, list[str]]) -> None:
        self._by_hash = {h.lower(): tenant for tenant, hashes in key_hashes.items() for h in hashes}

    def lookup(self, api_key: str) -> str | None:
        # the lookup is by hash: its timing tells nothing about the key itself
        return self._by_hash.get(hash_key(api_key))
