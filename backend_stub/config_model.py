"""The base of the backend's config models: a key the model does not know is an error, never ignored."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
