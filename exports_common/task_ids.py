"""Task ids: `<prefix>-YYYYMMDD-<suffix>`, unique without coordination."""
from __future__ import annotations

import functools
import re
import secrets
from datetime import UTC, datetime

TASK_ID_PATTERN = re.compile(r"^[a-z][a-z0-9]{1,15}-\d{8}-[0-9a-z]{16,32}$")
PREFIX_PATTERN = re.compile(r"^[a-z][a-z0-9]{1,15}$")
_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
SUFFIX_LENGTH = 20  # 36**20 ~ 2**103: collisions are out of reach without coordination


def new_task_id(prefix: str = "exp", now: datetime | None = None) -> str:
    day = (now or datetime.now(UTC)).strftime("%Y%m%d")
    suffix = "".join(secrets.choice(_ALPHABET) for _ in range(SUFFIX_LENGTH))
    return f"{prefix}-{day}-{suffix}"


@functools.lru_cache(maxsize=1024)  # a client polls one task again and again
def is_task_id(value: str) -> bool:
    return TASK_ID_PATTERN.fullmatch(value) is not None
