"""The export types in force: one registry, owned by the backend, swapped whole when its file changes.

`Registry` holds the types and the callback allow-list in force; `read` makes a new one from
backend.yaml and `apply` puts it in force (backend_stub.reload decides when: file events,
SIGHUP, POST /internal/reload, and refuses a file that does not validate or removes types).
Settings a reload cannot apply (ports, stores, workers) are named and wait for a restart.

Each type's definition is kept as written in the file (`${ENV}` references unexpanded, so
no secret is in it) under the digest of its canonical JSON. A task records the digest when
it is created and every attempt and re-run reads the definition back from the task store, so
editing or removing a type never changes what an existing task exports. A definition is kept
while a task names it: the janitor removes one that no task names and that no backend has
recorded for two RECORD_REFRESH_SEC (each records the definitions it creates tasks under at
least that often), so none is removed between its recording and the task that names it.

`GET /export-types` answers with an `ETag` (the digest of its body) and 304 to a matching
`If-None-Match`, so the gateways can re-read it every few seconds for nothing. The gateway's
own fetch carries no `X-Tenant-Id`: its answer also holds the callback allow-list, which a
tenant's request through the public route never sees.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from backend_stub import metrics
from backend_stub.config import BackendConfig, ExportTypeConfig
from backend_stub.store import TaskStore
from backend_stub.type_view import public_type
from exports_common.config_loader import ConfigError, interpolate, load_model, read_yaml
from exports_common.netpolicy import AddressPolicy

log = logging.getLogger("backend.registry")
RECORD_REFRESH_SEC = 3600.0  # how often a backend records again a definition it creates tasks under


def digest_of(definition: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(definition).encode()).hexdigest()


def canonical(definition: Mapping[str, Any]) -> str:
    return json.dumps(definition, sort_keys=True, separators=(",", ":"), default=str)


def written_types(path: str | None, config: BackendConfig) -> dict[str, dict[str, Any]]:
    """Each type's block as written in the file (`${ENV}` unexpanded); a config not read from a file: its values."""
    raw: Any = None
    if path is not None:
        try:
            raw = read_yaml(path)  # within the loader's bounds on size and aliases
        except ConfigError:
            raw = None
    blocks = raw.get("export_types") if isinstance(raw, dict) else None
    if isinstance(blocks, dict) and set(blocks) == set(config.export_types):
        return {str(name): dict(block) for name, block in blocks.items()}
    return {name: spec.model_dump(mode="json", exclude_defaults=True) for name, spec in config.export_types.items()}


@dataclass(frozen=True)
class Snapshot:
    """One version of the registry: the types, their definitions as written and digests, the callback policy."""

    types: Mapping[str, ExportTypeConfig]
    definitions: Mapping[str, dict[str, Any]]
    digests: Mapping[str, str]
    allow_hosts: tuple[str, ...]
    allow_networks: tuple[str, ...]

    @classmethod
    def of(cls, config: BackendConfig, path: str | None) -> Snapshot:
        definitions = written_types(path, config)
        return cls(types=dict(config.export_types), definitions=definitions,
                   digests={name: digest_of(block) for name, block in definitions.items()},
                   allow_hosts=tuple(config.callbacks.allow_hosts),
                   allow_networks=tuple(config.callbacks.allow_networks))

    @property
    def callback_policy(self) -> AddressPolicy:
        return AddressPolicy.from_lists(list(self.allow_hosts), list(self.allow_networks))

    def answer(self, for_gateway: bool) -> dict[str, Any]:
        """The body of GET /export-types; the gateway's own fetch (no tenant) also gets the callback allow-list."""
        data: dict[str, Any] = {"items": [public_type(name, spec) for name, spec in self.types.items()]}
        if for_gateway:
            data["callbacks"] = {"allow_hosts": list(self.allow_hosts), "allow_networks": list(self.allow_networks)}
        return data


def etag_of(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


class Registry:
    """The registry in force, its reload, and the definitions tasks were created under."""

    def __init__(self, config: BackendConfig, path: str | None, store: TaskStore) -> None:
        self.config = config
        self.path = path
        self.store = store
        self.current = Snapshot.of(config, path)
        self._started_file = self._file() or config
        self._parsed: dict[str, ExportTypeConfig] = {}  # digest -> the definition as a model, for attempts
        self._listeners: list[Callable[[Snapshot], None]] = []
        self._recorded: dict[str, float] = {}  # digest -> when this process last stored it (monotonic)

    def _file(self) -> BackendConfig | None:
        try:
            return load_model(self.path, BackendConfig) if self.path else None
        except ConfigError:
            return None

    def on_change(self, listener: Callable[[Snapshot], None]) -> None:
        """`listener(snapshot)` is called after each applied reload."""
        self._listeners.append(listener)

    async def record(self, export_type: str) -> str:
        """Store the type's definition in force under its digest (before a task names it) and return the digest."""
        digest = self.current.digests[export_type]
        now = time.monotonic()
        if now - self._recorded.get(digest, -RECORD_REFRESH_SEC) >= RECORD_REFRESH_SEC:
            # at most one write per definition, process and RECORD_REFRESH_SEC; the write also tells the janitor
            # the definition is in use (it removes only those unrecorded for longer, which no task names)
            await self.store.put_type_definition(digest, canonical(self.current.definitions[export_type]))
            self._recorded[digest] = now
        return digest

    async def definition(self, export_type: str, digest: str) -> ExportTypeConfig | None:
        """The type a task was created under: its recorded definition, or (an older task without one) the type
        in force; None when neither is there any more."""
        if not digest:
            return self.current.types.get(export_type)
        if digest in self._parsed:
            return self._parsed[digest]
        if self.current.digests.get(export_type) == digest:
            spec = self.current.types[export_type]
        else:
            written = await self.store.type_definition(digest)
            if written is None:
                return None
            missing: list[str] = []
            spec = ExportTypeConfig.model_validate(interpolate(json.loads(written), export_type, missing))
            if missing:
                raise ValueError("; ".join(missing))
        self._parsed[digest] = spec
        return spec

    def read(self) -> tuple[BackendConfig, Snapshot]:
        """The file as it is now, and the registry it makes; blocking (reads and validates), so callers run it off
        the event loop. Raises ConfigError when the file does not validate."""
        assert self.path is not None, "a registry read from a file"
        config = load_model(self.path, BackendConfig)
        return config, Snapshot.of(config, self.path)

    def apply(self, config: BackendConfig, snapshot: Snapshot) -> list[str]:
        """Put `snapshot` in force (the types and the callback allow-list); the settings of `config` that differ
        from the start and wait for a restart."""
        restart = config.restart_required(self._started_file)
        if snapshot == self.current:
            return restart
        for warning in config.load_warnings():
            log.warning("config reloaded with a warning", extra={"warning": warning})
        added = sorted(set(snapshot.types) - set(self.current.types))
        removed = sorted(set(self.current.types) - set(snapshot.types))
        changed = sorted(n for n in snapshot.types if n in self.current.digests
                         and snapshot.digests[n] != self.current.digests[n])
        self.current = snapshot
        metrics.seed(snapshot.types, self.config.workers)
        for listener in self._listeners:
            listener(snapshot)
        log.info("export types reloaded", extra={"added": added, "removed": removed, "changed": changed,
                                                 "types": len(snapshot.types)})
        return restart
