"""The most a config may set as a request body's size, an upstream answer's or a task's filters': what is read of a
body to check it, fingerprint it or send it again, and what a plugin reads of an answer, is held in memory whole, so
no setting may make that unbounded."""
from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

MIB = 1024 * 1024
MAX_BODY_BYTES = 64 * MIB
MAX_FILTERS_BYTES = MIB


def _at_most(limit: int, why: str) -> AfterValidator:
    def check(value: int) -> int:
        if value > limit:
            raise ValueError(f"must be at most {limit} ({limit // MIB} MiB): {why}")
        return value

    return AfterValidator(check)


BodyBytes = Annotated[int, _at_most(MAX_BODY_BYTES, "a body the gateway or the backend reads is held in memory; "
                                    "send large files to storage, not through the API"),
                      Field(json_schema_extra={"maximum": MAX_BODY_BYTES})]
AnswerBytes = Annotated[int, _at_most(MAX_BODY_BYTES, "an upstream's answer a plugin reads whole (to sign links, "
                                      "cache or store it) is held in memory; downloads stream and are not bounded"),
                        Field(json_schema_extra={"maximum": MAX_BODY_BYTES})]
FiltersBytes = Annotated[int, _at_most(MAX_FILTERS_BYTES, "a task's filters are checked whole and kept with the task"),
                         Field(json_schema_extra={"maximum": MAX_FILTERS_BYTES})]
