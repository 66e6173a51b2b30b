"""`source: {kind: synthetic, dataset, rows, seed}`: the deterministic demo data sets, generated, never stored.

Filters are applied as rows are generated, so a filtered export still scans every
row: it yields one batch per `BATCH_ROWS` scanned (empty when nothing matched) and
reports progress by the share scanned, since it cannot tell how many will match.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import islice
from typing import Any, Literal

from pydantic import Field, JsonValue, field_validator

from backend_stub.config_model import Strict
from backend_stub.datasets import DATASETS
from backend_stub.filters import FilterSpec, compile_filters
from backend_stub.sources.base import Batch, RowSource, SourceContext

BATCH_ROWS = 5_000


class SyntheticSource(Strict):
    """A seeded generator: the same dataset, rows and seed always give the same rows."""

    kind: Literal["synthetic"]
    dataset: str = Field(description="which data set", json_schema_extra={"enum": list[JsonValue](sorted(DATASETS))})
    rows: int = Field(100_000, ge=1, le=100_000_000, description="size of the generated data set")
    seed: int = 1

    @field_validator("dataset")
    @classmethod
    def _dataset_exists(cls, dataset: str) -> str:
        if dataset not in DATASETS:
            raise ValueError(f"unknown dataset {dataset!r}; known: {', '.join(sorted(DATASETS))}")
        return dataset

    def known_columns(self) -> Sequence[str]:
        return DATASETS[self.dataset].columns

    def expected_rows(self) -> int:
        return self.rows

    def open(self, ctx: SourceContext, filters: Mapping[str, FilterSpec]) -> SyntheticRows:
        return SyntheticRows(self, ctx, filters)


class SyntheticRows(RowSource):
    def __init__(self, config: SyntheticSource, ctx: SourceContext, filters: Mapping[str, FilterSpec]) -> None:
        dataset = DATASETS[config.dataset]
        self.columns = list(dataset.columns)
        self._config = config
        self._ctx = ctx
        self._generate = dataset.generate
        self._keep = compile_filters(filters, dataset.columns, dict(ctx.filters))

    def estimate_rows(self) -> int | None:
        return self._config.rows if self._keep is None else None

    def batches(self) -> Iterator[Batch]:
        rows: Iterator[tuple[Any, ...]] = self._generate(self._config.seed, self._config.rows)
        keep, total, scanned = self._keep, self._config.rows, 0
        while batch := list(islice(rows, BATCH_ROWS)):
            if keep is not None:
                scanned += len(batch)
                self._ctx.set_progress(5 + 90 * scanned // total)
                batch = [row for row in batch if keep(row)]
            yield batch
