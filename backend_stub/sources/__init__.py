"""Where export rows come from: one module per `source:` kind, each a config model and what it opens.

`SourceConfig` is the `source:` block of an export type, a union discriminated on
`kind`. A new kind is one module here (its pydantic model with `kind: Literal[...]`,
implementing `base.SourceKind`, and the `Source` it opens) and one member added below;
nothing else names the kinds.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from backend_stub.sources.base import (
    API_VERSION,
    Batch,
    Body,
    BodyKind,
    CheckedAtLoad,
    RowSource,
    Source,
    SourceContext,
    SourceKind,
    TextValuesKind,
    TypedSource,
)
from backend_stub.sources.http import HttpSource
from backend_stub.sources.python import PythonSource
from backend_stub.sources.sql import SqlSource
from backend_stub.sources.synthetic import SyntheticSource

SourceConfig = Annotated[SyntheticSource | SqlSource | PythonSource | HttpSource, Field(discriminator="kind")]
# the kinds whose result is a file as it comes (format raw), not rows: see base.BodyKind
BODY_KINDS = (HttpSource,)

__all__ = ["API_VERSION", "BODY_KINDS", "Batch", "Body", "BodyKind", "CheckedAtLoad", "RowSource", "Source",
           "SourceConfig", "SourceContext", "SourceKind", "TextValuesKind",
           "TypedSource"]
