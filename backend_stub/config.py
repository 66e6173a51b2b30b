"""The backend's configuration, as read from config/backend.yaml."""
from __future__ import annotations

import base64
import ipaddress
import os
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from backend_stub.compression import Compression
from backend_stub.config_model import Strict
from backend_stub.filters import FilterSpec
from backend_stub.formats import FORMATS, RAW
from backend_stub.sources import BODY_KINDS, CheckedAtLoad, SourceConfig
from exports_common import dev_mode
from exports_common.body_bounds import BodyBytes, FiltersBytes
from exports_common.connection_limits import ConnectionLimits
from exports_common.contract import DOWNLOAD_PATH
from exports_common.netpolicy import AddressPolicy
from exports_common.otel import TracingConfig
from exports_common.sql import SqlError, sync_url


class FaultConfig(Strict):
    """Fault injection for tests and game days; everything off by default."""

    failure_rate: float = Field(0.0, ge=0.0, le=1.0, description="share of attempts that fail transiently")
    fail_first_attempts: int = Field(0, ge=0, description="the first N attempts of every task fail transiently")
    delay_sec: float = Field(0.0, ge=0.0, description="extra time spread over the render step")


class HttpFaultConfig(Strict):
    """Answers a share of API requests with an error before handling them (fault injection)."""

    error_rate: float = Field(0.0, ge=0.0, le=1.0)
    status: int = Field(503, ge=500, le=599)
    path_prefix: str = "/exports"
    tenants: list[str] = Field(default_factory=list, description="only these tenants' requests (X-Tenant-Id); "
                                                                 "empty: everyone's")


class CallbackConfig(Strict):
    """Signed callbacks (Standard Webhooks) to each task's callback_url."""

    retry_delays_sec: list[float] = Field(default_factory=lambda: [1.0, 4.0, 16.0],
                                          description="waits between tries; then the callback is FAILED")
    timeout_sec: float = Field(10.0, gt=0, description="per try")
    concurrency: int = Field(8, ge=1, le=256, description="deliveries in flight at once")
    per_tenant_concurrency: int | None = Field(None, ge=1, le=256, description="at most this many in flight for one "
                                               "tenant, so others always find a slot; default half of concurrency")
    scan_limit: int = Field(1000, ge=1, le=100_000, description="due deliveries looked at per poll, soonest first")
    poll_interval_sec: float = Field(0.2, gt=0)
    claim_lease_sec: float | None = Field(None, gt=0, description=(
        "how long a backend holds a delivery it claimed; if it dies mid-delivery, another backend sends it "
        "again after this. Longer than timeout_sec; default timeout_sec + 20"))
    secrets: dict[str, list[str]] = Field(default_factory=dict, description="tenant -> whsec_ secrets; all sign")
    default_secrets: list[str] = Field(default_factory=list, description="for tenants without their own")
    allow_hosts: list[str] = Field(default_factory=list, description=(
        "non-public hosts that may be called; the gateways learn the list from /export-types and judge callback "
        "URLs with it, and a reload applies a change"))
    allow_networks: list[str] = Field(default_factory=list, description=(
        "non-public CIDRs that may be called (learned by the gateways like allow_hosts)"))

    @field_validator("secrets", "default_secrets")
    @classmethod
    def _whsec(cls, value: Any) -> Any:
        lists = value.values() if isinstance(value, dict) else [value]
        for secret in (s for group in lists for s in group):
            try:
                ok = secret.startswith("whsec_") and len(base64.b64decode(secret[6:], validate=True)) >= 16
            except ValueError:
                ok = False
            if not ok:
                raise ValueError("a webhook secret is 'whsec_' and the base64 of at least 16 random bytes")
        return value

    def secrets_for(self, tenant: str) -> list[str]:
        return self.secrets.get(tenant) or self.default_secrets

    def claim_lease(self) -> float:
        return self.claim_lease_sec if self.claim_lease_sec is not None else self.timeout_sec + 20

    @model_validator(mode="after")
    def _claim_outlasts_a_try(self) -> CallbackConfig:
        if self.claim_lease() <= self.timeout_sec:
            raise ValueError("claim_lease_sec must be longer than timeout_sec: a claim that ends mid-try lets "
                             "another backend send the same notification again")
        return self


class SourcesConfig(Strict):
    """Which non-public addresses sources may connect to (http endpoints); apart from the callback lists."""

    allow_hosts: list[str] = Field(default_factory=list, description="non-public hosts a source may call")
    allow_networks: list[str] = Field(default_factory=list, description="non-public CIDRs a source may call")

    @field_validator("allow_networks")
    @classmethod
    def _networks(cls, networks: list[str]) -> list[str]:
        for cidr in networks:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"{cidr!r} is not a network: write it as CIDR, e.g. 10.0.0.0/8") from None
        return networks

    def policy(self) -> AddressPolicy:
        return AddressPolicy.from_lists(self.allow_hosts, self.allow_networks)


class DownloadLinkConfig(Strict):
    """How callbacks name the result: the gateway's signed link (the same secret as the gateway's)."""

    base_url: str = Field("", pattern=r"^(https?://[^/\s?#]+(/[^\s?#]*)?)?$",
                          description="the gateway's public URL (its public_base_url); required outside dev mode")
    path: str = DOWNLOAD_PATH
    secrets: list[str] = Field(min_length=1)

    def base(self) -> str:
        return (self.base_url or dev_mode.DEV_PUBLIC_URL).rstrip("/")


class DownloadRedirectConfig(Strict):
    """Downloads answered with a redirect to the object store (s3:// only), so the bytes skip the backends."""

    ttl_sec: int = Field(0, ge=0, le=3600, description=(
        "0: downloads stream through the backend (the default); N: a download answers 307 to a presigned "
        "store URL valid N seconds (never past the task's expiry)"))
    public_endpoint: str = Field("", pattern=r"^(https?://[^/\s?#]+)?$", description=(
        "the store's endpoint as clients reach it, if not AWS_ENDPOINT_URL (empty: that, or AWS's own)"))


def _offered_format(name: str) -> str:
    if name not in FORMATS and name != RAW:
        raise ValueError(f"unknown format {name!r}; this backend writes {', '.join([*FORMATS, RAW])}")
    return name


OfferedFormat = Annotated[str, AfterValidator(_offered_format),
                          WithJsonSchema({"type": "string", "enum": [*FORMATS, RAW]})]
FLAT_SHAPE_KEYS = ("dataset", "rows", "seed")
SERVICE_TOKEN_ENV = "BACKEND_SERVICE_TOKEN"
MIN_SERVICE_TOKEN = 32


class ExportTypeConfig(Strict):
    """One export type: where its rows come from (`source`), what a client may filter and which files it gets."""

    source: SourceConfig
    filters: dict[str, FilterSpec] = Field(default_factory=dict)
    formats: list[OfferedFormat] = Field(["csv"], min_length=1, description=(
        "the formats a submit may ask for; the first is what a submit naming none gets"))
    compression: Compression | None = Field(None, description=(
        "gzip: files stored and served compressed (<task_id>.csv.gz, application/gzip)"))
    max_rows: int | None = Field(None, ge=1, description="an export with more rows FAILS (not retryable)")
    max_bytes: int | None = Field(None, ge=1, description="an export whose stored file is larger FAILS (not retryable)")
    csv_escape_formulas: bool = Field(False, description=(
        "CSV: a text cell starting with =, +, - or @ gets a leading ' so spreadsheets do not run it"))
    max_attempts: int = Field(3, ge=1, le=20)
    estimated_rows_per_sec: int = Field(400_000, ge=1)
    fault: FaultConfig = Field(default_factory=FaultConfig)
    _flat_shape: bool = PrivateAttr(False)

    @model_validator(mode="wrap")
    @classmethod
    def _old_flat_shape(cls, data: Any, handler: ModelWrapValidatorHandler[ExportTypeConfig]) -> ExportTypeConfig:
        """The shape before sources: `dataset`, `rows` and `seed` at the type's top level, a synthetic source."""
        flat = isinstance(data, dict) and any(key in data for key in FLAT_SHAPE_KEYS)
        if flat and "source" in data:
            raise ValueError("dataset, rows and seed belong inside source: {kind: synthetic, ...}, not beside it")
        if flat:  # every type offered both formats then: so it still does, unless it lists its own
            data = {"formats": ["csv", "jsonl"]} | {key: value for key, value in data.items()
                                                     if key not in FLAT_SHAPE_KEYS} | {
                "source": {"kind": "synthetic", **{key: data[key] for key in FLAT_SHAPE_KEYS if key in data}}}
        model = handler(data)
        model._flat_shape = flat
        return model

    @property
    def flat_shape(self) -> bool:
        return self._flat_shape

    @model_validator(mode="after")
    def _consistent(self) -> ExportTypeConfig:
        self.filters = {name: spec if spec.column else spec.model_copy(update={"column": name})
                        for name, spec in self.filters.items()}
        if len(set(self.formats)) < len(self.formats):
            raise ValueError(f"formats lists a format twice: {self.formats}")
        if isinstance(self.source, BODY_KINDS) and self.formats != [RAW]:
            raise ValueError(f"a {self.source.kind} source's result is the file it answers: set formats: [raw]")
        if not isinstance(self.source, BODY_KINDS) and RAW in self.formats:
            raise ValueError(f"format raw is the answer of an http source; a {self.source.kind} source writes rows: "
                             f"offer {', '.join(FORMATS)}")
        columns = self.source.known_columns()
        if columns is not None:
            for name, spec in self.filters.items():
                if spec.column not in columns:
                    raise ValueError(f"filter {name!r}: the source has no column {spec.column!r} "
                                     f"(its columns: {', '.join(columns)})")
        return self


class ChangeLogConfig(Strict):
    """The store's log of task changes, which push consumers follow and resume from."""

    retention_sec: int = Field(600, ge=600, le=86_400, description=(
        "entries are kept at least this long: a consumer that was away longer starts again from the current "
        "state. Memory grows with the changes per second times this"))
    feed: bool = Field(True, description="serve the log as GET /events, which gateways follow to push task "
                       "changes to their clients (false: gateways poll each watched task instead)")
    feed_heartbeat_sec: float = Field(5.0, gt=0, le=60, description=(
        "a quiet feed sends its position this often, so a gateway can tell a live feed from a dead one"))
    catch_up_max_entries: int = Field(10_000, ge=100, le=1_000_000, description=(
        "a tenant's catch-up on the feed (a client's stream resumed with Last-Event-ID) reads at most this many "
        "of the log's entries, every tenant's counted; past that the feed answers a gap and the stream starts "
        "again from the tenant's current tasks"))


class SchedulerConfig(Strict):
    """How workers share themselves among tenants: weighted fair turns, an optional cap on running tasks."""

    default_weight: int = Field(1, ge=1, le=1000, description="a tenant's share of workers relative to others")
    weights: dict[str, Annotated[int, Field(ge=1, le=1000)]] = Field(
        default_factory=dict, description="tenant -> its own weight")
    default_max_running: int | None = Field(None, ge=1, description="at most this many of one tenant's tasks "
                                            "running at once over all backends; none: no cap")
    max_running: dict[str, Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict, description="tenant -> its own running cap")


# what a reload of the file applies; every other change waits for a restart (and a reload says which)
RELOADED = frozenset({"export_types"})
RELOADED_CALLBACKS = frozenset({"allow_hosts", "allow_networks"})


class BackendConfig(Strict):
    host: str = "127.0.0.1"
    port: int = Field(8081, ge=0, le=65535)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    data_dir: str = ".data/backend"
    min_free_bytes: int = Field(1 << 30, ge=0, description=(
        "free space data_dir must keep: below it this backend claims no new task and /readyz answers 503 until "
        "space is back (its exports spool there before they are stored)"))
    redis_url: str = Field("", description="set: shared Redis store and "
                           "queue (redis://HOST:PORT/DB, or redis+cluster://HOST:PORT for a Redis Cluster)")
    redis_prefix: str = "exports"
    database_url: str = Field("", description=(
        "set: the task store, queue and change log in PostgreSQL (>= 13) or MariaDB (>= 10.6) / MySQL (>= 8.0), "
        "shared by every backend on it: postgresql://USER:PASSWORD@HOST:PORT/DB or mysql://... "
        "(BACKEND_DATABASE_URL in the shipped config)"))
    database_pool_size: int = Field(10, ge=1, le=200, description="connections this backend opens to database_url")
    database_pool_timeout_sec: float = Field(5.0, gt=0, le=60, description=(
        "how long a request waits for a free connection before it answers 503"))
    store: Literal["", "sql", "redis", "sqlite"] = Field("", description=(
        "which store holds the tasks: sql (database_url), redis (redis_url) or sqlite (embedded); empty: the "
        "one whose URL is set, SQLite if none. Required when both URLs are set"))
    result_store: str = Field("", pattern=r"^$|^file://.+|^s3://[^/]+(/.*)?$", description=(
        "where result files live: empty (file:// under data_dir), file://PATH, or s3://BUCKET/PREFIX "
        "(AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION); several backends need "
        "one store they all read"))
    download_redirect: DownloadRedirectConfig = Field(default_factory=DownloadRedirectConfig)
    workers: int = Field(2, ge=1, le=64)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    change_log: ChangeLogConfig = Field(default_factory=ChangeLogConfig)
    lease_sec: float = Field(30.0, gt=0, description="a dead worker's task is picked up again after this")
    progress_interval_sec: float = Field(0.5, gt=0)
    task_ttl_sec: int = Field(86_400, ge=1, le=72 * 3600, description="terminal tasks and files are deleted after this")
    sweep_interval_sec: float = Field(60.0, gt=0)
    default_timeout_sec: int = Field(300, ge=1)
    max_timeout_sec: int = Field(3600, ge=1)
    max_body_bytes: BodyBytes = Field(65_536, ge=1024)
    max_header_bytes: int = Field(16_384, ge=1024, le=65536, description="larger request headers get 431")
    connection_limits: ConnectionLimits = Field(default_factory=ConnectionLimits)
    shutdown_timeout_sec: int = Field(30, ge=1, le=3600, description="on SIGTERM, open requests get at most "
                                        "this long to finish")
    max_filters_bytes: FiltersBytes = Field(8_192, ge=64)
    http_fault: HttpFaultConfig = Field(default_factory=HttpFaultConfig)
    callbacks: CallbackConfig = Field(default_factory=CallbackConfig)
    sources: SourcesConfig = Field(default_factory=SourcesConfig)
    download_links: DownloadLinkConfig = Field(
        default_factory=lambda: DownloadLinkConfig(secrets=[dev_mode.DEV_SIGNING_SECRET]))
    export_types: dict[str, ExportTypeConfig]
    tracing: TracingConfig = Field(default_factory=TracingConfig)
    _source_warnings: list[str] = PrivateAttr(default_factory=list)
    service_token: str = Field("", description=(
        "the token every caller but the probes must send as 'Authorization: Bearer <token>' (the gateways' "
        "upstream service_token); empty: BACKEND_SERVICE_TOKEN. Required outside dev mode"))

    def required_token(self) -> str:
        """The service token in force: the config's, else BACKEND_SERVICE_TOKEN's ("" in dev mode: no check)."""
        return self.service_token or os.environ.get(SERVICE_TOKEN_ENV, "")

    def load_warnings(self) -> list[str]:
        """What loads but should be written otherwise: one sentence each, naming the new way."""
        flat = [name for name, spec in self.export_types.items() if spec.flat_shape]
        warnings = list(self._source_warnings)
        if not flat:
            return warnings
        return [f"export_types {', '.join(flat)}: dataset, rows and seed at the type's top level is the old flat "
                f"shape; write them as source: {{kind: synthetic, dataset: ..., rows: ..., seed: ...}}", *warnings]

    def restart_required(self, running: BackendConfig) -> list[str]:
        """The settings that differ from `running` and that a reload does not apply (it applies export_types
        and callbacks.allow_hosts / allow_networks)."""
        changed = [name for name in type(self).model_fields
                   if name not in RELOADED and getattr(self, name) != getattr(running, name)]
        if "callbacks" in changed:
            changed.remove("callbacks")
            changed += [f"callbacks.{name}" for name in CallbackConfig.model_fields if name not in RELOADED_CALLBACKS
                        and getattr(self.callbacks, name) != getattr(running.callbacks, name)]
        return changed

    def unsafe_defaults(self) -> list[str]:
        """What makes this config unfit outside dev mode, each with what to set instead."""
        problems = []
        token = self.required_token()
        if len(token) < MIN_SERVICE_TOKEN:
            problems.append(f"service_token is {'empty' if not token else 'too short'}: set {SERVICE_TOKEN_ENV} "
                            f"(and the gateways' EXPORT_BACKEND_TOKEN) to the same {MIN_SERVICE_TOKEN}+ random "
                            f"characters, so that only the gateways can call this backend")
        if not self.download_links.base_url:
            problems.append("download_links.base_url is empty: set GATEWAY_PUBLIC_URL to the gateway's public URL")
        if dev_mode.DEV_SIGNING_SECRET in self.download_links.secrets:
            problems.append("download_links.secrets holds the published dev secret: set DOWNLOAD_SIGNING_SECRET "
                            "(the same value as the gateway's)")
        published = dev_mode.DEV_WEBHOOK_SECRETS
        for tenant, secrets in self.callbacks.secrets.items():
            if published & set(secrets):
                problems.append(f"callbacks.secrets.{tenant} holds a published demo webhook secret: set "
                                f"{tenant.upper()}_WEBHOOK_SECRET (or replace it) with whsec_ and 24+ random bytes")
        if published & set(self.callbacks.default_secrets):
            problems.append("callbacks.default_secrets holds a published demo webhook secret: replace it")
        return problems

    def store_kind(self) -> Literal["sql", "redis", "sqlite"]:
        if self.store:
            return self.store
        return "sql" if self.database_url else "redis" if self.redis_url else "sqlite"

    @model_validator(mode="after")
    def _one_store(self) -> BackendConfig:
        if self.database_url and self.redis_url and not self.store:
            raise ValueError("both database_url and redis_url are set: set store: sql or store: redis to say "
                             "which one holds the tasks")
        if self.store == "sql" and not self.database_url:
            raise ValueError("store: sql needs database_url (or BACKEND_DATABASE_URL)")
        if self.store == "redis" and not self.redis_url:
            raise ValueError("store: redis needs redis_url (or REDIS_URL)")
        if self.database_url:
            try:
                dialect = sync_url(self.database_url).get_dialect().name
            except SqlError as error:
                raise ValueError(f"database_url: {error.message}") from None
            if dialect == "sqlite":
                raise ValueError("database_url: the task store is on PostgreSQL or MariaDB/MySQL; for SQLite "
                                 "leave database_url empty (the embedded store under data_dir)")
        return self

    @model_validator(mode="after")
    def _timeouts(self) -> BackendConfig:
        if self.default_timeout_sec > self.max_timeout_sec:
            raise ValueError("default_timeout_sec must not exceed max_timeout_sec")
        if not self.export_types:
            raise ValueError("declare at least one export type")
        if self.download_redirect.ttl_sec and not self.result_store.startswith("s3://"):
            raise ValueError("download_redirect.ttl_sec needs an s3:// result_store (a file store has no URL to "
                             "redirect to): set it to 0 or use s3://BUCKET/PREFIX")
        return self

    @model_validator(mode="after")
    def _sources_checked(self) -> BackendConfig:
        """Sources that can check themselves against their data (a database's columns) do so at load."""
        for name, spec in self.export_types.items():
            if isinstance(spec.source, CheckedAtLoad):
                try:
                    found = spec.source.check_at_load(spec.filters)
                except ValueError as error:
                    raise ValueError(f"export_types.{name}.source: {error}") from None
                self._source_warnings += [f"export type {name} {warning}" for warning in found]
        return self
