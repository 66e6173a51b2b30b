"""The built-in plugins, each implemented in one module.

The names a route may list are these and the installed packages' plugins: ask gateway.plugin_registry.
Timeouts, retries and breakers are not plugins but the route's upstream call (gateway/policy/).
"""
from __future__ import annotations

from gateway.plugins.auth import Auth
from gateway.plugins.base import Plugin
from gateway.plugins.events import Events
from gateway.plugins.fault import Fault
from gateway.plugins.idempotency import Idempotency
from gateway.plugins.list_query import ListQuery
from gateway.plugins.outbox import Outbox
from gateway.plugins.rate_limit import RateLimit
from gateway.plugins.rerun import Rerun
from gateway.plugins.signed_download import SignedDownload
from gateway.plugins.stale_if_error import StaleIfError
from gateway.plugins.status_cache import StatusCache
from gateway.plugins.task_id import TaskId
from gateway.plugins.validate import Validate

# each class takes its own Settings type; the config layer validated settings against cls.Settings
PLUGINS: dict[str, type[Plugin]] = {cls.name: cls for cls in (
    RateLimit, Auth, Validate, ListQuery, Idempotency, TaskId, StatusCache, SignedDownload,
    Rerun, StaleIfError, Outbox, Fault, Events,
)}
