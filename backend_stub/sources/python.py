"""`source: {kind: python, entry_point: NAME, options: {...}}`: rows from an installed package (interface v1).

For data no SQL reaches. A package offers a source through the entry-point group
`export_backend.sources`; the entry point names an object with `api_version = 1` and
`open(ctx) -> Source`, and optionally `columns` (a list of names) when they are fixed, so
that the type's filters are checked against them at load. The object is loaded when the
config loads: an entry point no installed package offers, or another interface version,
refuses the config, naming the type.

`open` runs in the worker thread, once per attempt. `ctx` is the attempt's `SourceContext`
(`filters`, `tenant`, `task_id`, `attempt`, `deadline`, `cancelled()`, `set_step()`,
`set_progress()`) plus `options`, the type's `options:` block as written. The `Source` it
returns has `columns`, `estimate_rows()` and `batches()` (lists of tuples); if it is a context
manager it is entered and exited, else its `close()` (if any) is called when the attempt ends.

The backend applies the type's declared filters to every row the source yields (a source may
also use `ctx.filters` to read less: rows it already left out are not missed), so a source that
ignores them is still correct; a date filter compares a `date` value or a `YYYY-MM-DD` string.
A source that ignores `cancelled()` is stopped at its next batch. To fail, it raises
`backend_stub.failures.TransientFailure` (another attempt) or `PermanentFailure(code, message)`;
any other exception fails the task as `SOURCE_ERROR` naming only the exception's type, never
its message (which might hold a URL or a credential).
"""
from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from datetime import date
from importlib.metadata import entry_points
from typing import Any, Literal

from pydantic import Field, JsonValue, model_validator

from backend_stub.config_model import Strict
from backend_stub.failures import Cancelled, PermanentFailure, TransientFailure
from backend_stub.filters import FilterSpec, Predicate, compile_filters
from backend_stub.sources.base import API_VERSION, Batch, RowSource, SourceContext

GROUP = "export_backend.sources"
log = logging.getLogger("backend.sources.python")


@functools.cache
def load_plugin(name: str) -> Any:
    """The object the entry point `name` of GROUP names; ValueError saying what is wrong when it cannot be used."""
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if not found:
        installed = sorted(ep.name for ep in entry_points(group=GROUP))
        raise ValueError(f"no installed package offers the source {name!r} (entry-point group {GROUP}); "
                         f"installed: {', '.join(installed) or 'none'}")
    try:
        plugin = found[0].load()
    except Exception as exc:  # whatever a package's import raises, the config names it
        raise ValueError(f"source {name!r} does not import ({type(exc).__name__}: {exc})") from exc
    version = getattr(plugin, "api_version", None)
    if version != API_VERSION:
        raise ValueError(f"source {name!r} has api_version {version!r}; this backend runs source interface "
                         f"{API_VERSION}")
    if not callable(getattr(plugin, "open", None)):
        raise ValueError(f"source {name!r} has no open(ctx) method")
    return plugin


class PythonSource(Strict):
    """Rows from a Python package's source (entry-point group export_backend.sources, interface v1)."""

    kind: Literal["python"]
    entry_point: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$",
                             description="the source's name in the entry-point group export_backend.sources")
    options: dict[str, JsonValue] = Field(default_factory=dict, description=(
        "handed to the source as ctx.options, as written (the ${ENV} references expanded)"))

    @model_validator(mode="after")
    def _installed(self) -> PythonSource:
        load_plugin(self.entry_point)
        return self

    def known_columns(self) -> Sequence[str] | None:
        columns = getattr(load_plugin(self.entry_point), "columns", None)
        return list(columns) if isinstance(columns, (list, tuple)) else None

    def expected_rows(self) -> int | None:
        return None

    def open(self, ctx: SourceContext, filters: Mapping[str, FilterSpec]) -> PluginRows:
        return PluginRows(self, ctx, filters)


class PluginContext:
    """The attempt's context as the plugin sees it: the SourceContext, and the type's `options`."""

    def __init__(self, ctx: SourceContext, options: Mapping[str, Any]) -> None:
        self._ctx = ctx
        self.options = options
        self.filters = ctx.filters
        self.tenant = ctx.tenant
        self.task_id = ctx.task_id
        self.attempt = ctx.attempt
        self.deadline = ctx.deadline

    def cancelled(self) -> bool:
        return self._ctx.cancelled()

    def set_step(self, step: str) -> None:
        self._ctx.set_step(step)

    def set_progress(self, percent: int) -> None:
        self._ctx.set_progress(percent)


class PluginRows(RowSource):
    """A plugin's Source, held to the interface: failures named, filters applied, closed once."""

    def __init__(self, config: PythonSource, ctx: SourceContext, filters: Mapping[str, FilterSpec]) -> None:
        self._name = config.entry_point
        self._exits = ExitStack()
        with self._guard():
            source = load_plugin(self._name).open(PluginContext(ctx, config.options))
            if hasattr(source, "__enter__") and hasattr(source, "__exit__"):
                source = self._exits.enter_context(source)
            elif callable(getattr(source, "close", None)):
                self._exits.callback(source.close)
            self._source = source
            self.columns = [str(column) for column in source.columns]
        self._keep = self._predicate(filters, dict(ctx.filters))

    def _predicate(self, filters: Mapping[str, FilterSpec], values: dict[str, Any]) -> Predicate | None:
        for name in values:
            if filters[name].column not in self.columns:
                self.close()
                raise PermanentFailure("SOURCE_ERROR", f"filter {name}: source {self._name} has no column "
                                                       f"{filters[name].column!r}")
        keep = compile_filters(filters, self.columns, values)
        dated = {self.columns.index(filters[name].column) for name in values if filters[name].type == "date"}
        if keep is None or not dated:
            return keep
        test = keep

        def keep_dated(row: tuple[Any, ...]) -> bool:  # a date value compared as the YYYY-MM-DD a filter holds
            return test(tuple(v.isoformat()[:10] if i in dated and isinstance(v, date) else v
                              for i, v in enumerate(row)))
        return keep_dated

    def estimate_rows(self) -> int | None:
        with self._guard():
            estimate = self._source.estimate_rows()
        return estimate if isinstance(estimate, int) and estimate > 0 else None

    def batches(self) -> Iterator[Batch]:
        keep = self._keep
        with self._guard():
            for batch in self._source.batches():
                rows = [tuple(row) for row in batch]
                yield rows if keep is None else [row for row in rows if keep(row)]

    def close(self) -> None:
        with self._guard():
            self._exits.close()

    def _guard(self) -> contextlib.AbstractContextManager[None]:
        return _guarded(self._name)


@contextlib.contextmanager
def _guarded(name: str) -> Iterator[None]:
    """The interface's failures pass; any other exception of the plugin becomes SOURCE_ERROR naming only its type
    (its message might hold a URL or a credential)."""
    try:
        yield
    except (TransientFailure, PermanentFailure, Cancelled):
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a plugin raises, the task says which source failed
        log.warning("a source plugin failed", extra={"source": name, "error_type": type(exc).__name__})
        raise PermanentFailure("SOURCE_ERROR", f"source {name} failed ({type(exc).__name__}); its author can "
                                               f"tell why from the backend's log") from None
