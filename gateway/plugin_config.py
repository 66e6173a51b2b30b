"""A route's `plugins` list in the YAML: each entry names one plugin, validated against that plugin's settings.

Built-in and third-party plugins are validated alike, when the config is loaded.
Every problem names its route and keeps its exact path in the file
(routes[0].plugins[2].idempotency.ttl_sec), so check-config can point at the line;
an unknown plugin or setting comes with the nearest valid name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, GetCoreSchemaHandler, GetJsonSchemaHandler, ValidationError
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import InitErrorDetails, core_schema

from exports_common.config_loader import problem, unknown_key_message
from gateway.plugin_registry import GROUP, registry
from gateway.plugins import PLUGINS as BUILTIN

_ENTRY_SHAPE = "each plugin entry names exactly one plugin: `- name` or `- name: {settings}`"


@dataclass(frozen=True)
class PluginUse:
    """One entry of a route's chain: a plugin's name and its validated settings."""

    name: str
    settings: BaseModel

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        # entries are built by validate_entries (which knows the route); here only those pass, and dump as written
        return core_schema.no_info_plain_validator_function(
            _already_validated,
            serialization=core_schema.plain_serializer_function_ser_schema(_dump, info_arg=True))

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        one_plugin = {
            "type": "object", "minProperties": 1, "maxProperties": 1,
            # `- name:` with nothing after it (null) means no settings, as `- name` does
            "properties": {name: {"anyOf": [handler(plugin.Settings.__pydantic_core_schema__), {"type": "null"}]}
                           for name, plugin in BUILTIN.items()},
            "additionalProperties": {"type": ["object", "null"],
                                     "description": f"the settings of a third-party plugin (entry point group "
                                                    f"{GROUP}); check-config validates them"},
        }
        return {"description": "a plugin without settings by its name, or {name: settings}",
                "anyOf": [{"type": "string"}, one_plugin]}


def _already_validated(value: Any) -> PluginUse:
    if not isinstance(value, PluginUse):
        raise ValueError(_ENTRY_SHAPE)
    return value


def _dump(use: PluginUse, info: core_schema.SerializationInfo) -> dict[str, Any]:
    # keyed as the YAML writes them (aliases), so a dump reads back as the same config
    return {use.name: use.settings.model_dump(mode=info.mode, exclude_none=info.exclude_none, by_alias=True)}


def validate_entries(raw: Any, route: str) -> list[PluginUse]:
    """The route's plugin list, each entry's settings validated; every problem at once, as a ValidationError."""
    if not isinstance(raw, list):
        raise ValueError(f"route `{route}`: plugins must be a list")
    uses: list[PluginUse] = []
    errors: list[InitErrorDetails] = []
    for at, item in enumerate(raw):
        if isinstance(item, PluginUse):  # a config built in code from another's entries
            uses.append(item)
            continue
        entry = {item: None} if isinstance(item, str) else item
        if not (isinstance(entry, dict) and len(entry) == 1 and isinstance(next(iter(entry)), str)):
            errors.append(problem((at,), f"route `{route}`: {_ENTRY_SHAPE}", item))
            continue
        [(name, settings)] = entry.items()
        found = registry().resolve(name)
        if isinstance(found, str):
            errors.append(problem((at, name), f"route `{route}`: {found}", settings))
            continue
        try:
            uses.append(PluginUse(name, found.Settings.model_validate({} if settings is None else settings)))
        except ValidationError as exc:
            errors.extend(_settings_error((at, name), found.Settings, err, route) for err in exc.errors())
    if errors:
        raise ValidationError.from_exception_data("plugins", errors)
    return uses


def _settings_error(at: tuple[str | int, ...], model: type[BaseModel], err: Any, route: str) -> InitErrorDetails:
    loc = tuple(err["loc"])
    message = (unknown_key_message(model, loc) if err["type"] == "extra_forbidden" else None) or err["msg"]
    return problem(at + loc, f"route `{route}`, plugin {at[-1]}: {message}", err["input"])
