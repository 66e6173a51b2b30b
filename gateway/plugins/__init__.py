"""The plugin registry: the names a route may list in its YAML, each implemented in one module."""
from __future__ import annotations

from gateway.plugins.auth import Auth
from gateway.plugins.idempotency import Idempotency
from gateway.plugins.signed_download import SignedDownload
from gateway.plugins.status_cache import StatusCache
from gateway.plugins.task_id import TaskId
from gateway.plugins.validate import Validate

PLUGINS = {cls.name: cls for cls in (Auth, Validate, Idempotency, TaskId, StatusCache, SignedDownload)}
