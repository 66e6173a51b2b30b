"""exports_client: the Python client of the export gateway, and the `exportctl` command.

It depends on httpx only (rich for the command's progress bar) and imports
nothing from the gateway or the backend, so a client installs it alone: the
`exports-client` distribution (built from sdk/), or bundled in the whole project's.
"""
import logging

from exports_client.aio import AsyncExportsClient
from exports_client.client import ExportsClient
from exports_client.errors import (
    ApiError,
    DownloadError,
    ExportsError,
    NotFound,
    RateLimited,
    Unavailable,
    WaitTimeout,
    WebhookVerificationError,
)
from exports_client.models import CallbackState, ExportType, Result, Task, TaskError
from exports_client.version import __version__
from exports_client.webhooks import verify_webhook

# its warnings (a retry of an unreachable gateway) are the application's to show: none unless it configures logging
logging.getLogger("exports_client").addHandler(logging.NullHandler())

__all__ = [
    "ApiError", "AsyncExportsClient", "CallbackState", "DownloadError", "ExportType", "ExportsClient", "ExportsError",
    "NotFound", "RateLimited", "Result", "Task", "TaskError", "Unavailable", "WaitTimeout",
    "WebhookVerificationError", "__version__", "verify_webhook",
]
