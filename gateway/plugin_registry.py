"""Which plugin a name in a route's YAML means: a built-in, or one an installed package declares.

A package offers plugins through the entry-point group `export_gateway.plugins`
(`name = "package.module:Class"` in its pyproject.toml). Discovery reads only the
installed packages' metadata; a plugin's module is imported when a route first
names it, so a broken package that no route uses costs nothing, and only the
plugins loaded run their process-wide hooks. What goes wrong
(an import that fails, a name a built-in has, a class that is not a plugin) is
returned as a sentence naming the package and the entry point, for the config
error, never raised as a traceback.

Packages installed or upgraded while the gateway runs are seen after a restart:
a module, once imported, is not imported again.
"""
from __future__ import annotations

import difflib
import functools
import inspect
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import cast

from pydantic import BaseModel

from gateway.plugins import PLUGINS as BUILTIN
from gateway.plugins.base import Plugin, PluginBase

GROUP = "export_gateway.plugins"
# the upstream call's parts (gateway/policy/): configured where they apply, never listed as plugins
NOT_PLUGINS = {"timeout": "the route's policy.timeout", "retry": "the route's policy.retry",
               "circuit_breaker": "upstreams.<name>.circuit_breaker (a route's own: policy.circuit_breaker)"}


def _origin(ep: EntryPoint) -> str:
    dist = ep.dist
    package = f"package '{dist.name} {dist.version}'" if dist is not None else "an unknown package"
    return f"entry point '{ep.name} = {ep.value}' (group {GROUP}) of {package}"


def _not_a_plugin(obj: object, name: str) -> str | None:
    """Why `obj` cannot serve as the plugin `name`, or None when it can."""
    if not inspect.isclass(obj):
        return f"it names {type(obj).__name__} {obj!r}, not a class"
    if not issubclass(obj, PluginBase):
        return f"class {obj.__qualname__} does not subclass gateway.plugins.base.PluginBase"
    if inspect.isabstract(obj):
        return f"class {obj.__qualname__} leaves {', '.join(sorted(obj.__abstractmethods__))} undefined"
    if getattr(obj, "name", None) != name:
        return f"class {obj.__qualname__} says its name is {getattr(obj, 'name', None)!r}; make it {name!r}"
    settings = getattr(obj, "Settings", None)
    if not (inspect.isclass(settings) and issubclass(settings, BaseModel)):
        return f"{obj.__qualname__}.Settings must be a pydantic model (subclass gateway.plugins.base.Settings)"
    if settings.model_config.get("extra") != "forbid":
        # a typo in a route's settings would be ignored in silence, unlike in a built-in's
        return f"{obj.__qualname__}.Settings must forbid unknown keys (subclass gateway.plugins.base.Settings)"
    if not inspect.iscoroutinefunction(obj.__call__):
        return f"{obj.__qualname__}.__call__ must be `async def __call__(self, ctx)`"
    expected = list(inspect.signature(PluginBase.__init__).parameters)[1:]
    try:
        inspect.signature(obj).bind(*expected)
    except TypeError:
        return f"{obj.__qualname__} must be built as {obj.__qualname__}({', '.join(expected)})"
    return None


@dataclass
class Registry:
    """The built-ins, and the entry points found when the registry was made."""

    builtin: dict[str, type[Plugin]]
    declared: dict[str, list[EntryPoint]]
    _loaded: dict[str, type[Plugin] | str] = field(default_factory=dict)

    @classmethod
    def discover(cls) -> Registry:
        declared: dict[str, list[EntryPoint]] = {}
        for ep in entry_points(group=GROUP):
            declared.setdefault(ep.name, []).append(ep)
        return cls(dict(BUILTIN), declared)

    def names(self) -> list[str]:
        return sorted(self.builtin.keys() | self.declared.keys())

    def resolve(self, name: str) -> type[Plugin] | str:
        """The plugin class `name` means, or why no route can use it (a sentence for the config error)."""
        if name not in self._loaded:
            self._loaded[name] = self._resolve(name)
        return self._loaded[name]

    def get(self, name: str) -> type[Plugin]:
        """The class of a name that config validation accepted."""
        found = self.resolve(name)
        if isinstance(found, str):
            raise KeyError(found)
        return found

    def active(self) -> list[type[Plugin]]:
        """The plugins whose hooks run (gateway/plugin_hooks.py): the built-ins, and each installed one a route
        has named (loaded then); an installed package no route names is never imported."""
        loaded = [found for name, found in self._loaded.items() if name not in self.builtin]
        return [*self.builtin.values(), *(plugin for plugin in loaded if not isinstance(plugin, str))]

    def unloaded(self) -> list[str]:
        """The installed plugins no route has named so far (not imported)."""
        return sorted(name for name in self.declared if name not in self._loaded)

    def describe(self) -> tuple[list[str], int]:
        """One line per plugin name (where it comes from, or why no route can use it), and how many are unusable."""
        lines, unusable = [], 0
        for name in self.names():
            found = self.resolve(name)
            if isinstance(found, str):
                unusable += 1
                lines.append(f"{name}: UNUSABLE: {found}")
            else:
                lines.append(f"{name}: " + ("built in" if name in self.builtin else _origin(self.declared[name][0])))
        return lines, unusable

    def _resolve(self, name: str) -> type[Plugin] | str:
        eps = self.declared.get(name, [])
        if name in NOT_PLUGINS:
            clash = f"; {_origin(eps[0])} declares a plugin of that name: rename it" if eps else ""
            return f"{name!r} is not a plugin: it is part of the upstream call, set as {NOT_PLUGINS[name]}{clash}"
        if name in self.builtin:
            if eps:
                return (f"plugin {name!r} is built in, and {_origin(eps[0])} declares it too; rename that entry "
                        f"point (or uninstall the package) so that {name!r} means one thing")
            return self.builtin[name]
        if not eps:
            close = difflib.get_close_matches(name, self.names(), n=1)
            hint = f", did you mean {close[0]!r}?" if close else \
                f"; known plugins: {', '.join(self.names())} (a third-party plugin must be installed in the " \
                f"gateway's environment, declaring an entry point in group {GROUP}, and the gateway restarted)"
            return f"unknown plugin {name!r}{hint}"
        if len(eps) > 1:
            return (f"plugin {name!r} is declared by more than one package: "
                    f"{'; '.join(_origin(ep) for ep in eps)}; uninstall all but one")
        return self._load(eps[0])

    def _load(self, ep: EntryPoint) -> type[Plugin] | str:
        try:
            obj = ep.load()
        except Exception as exc:  # noqa: BLE001 - any failure of foreign code at import is a config error, said plainly
            return f"plugin {ep.name!r} cannot be imported: {_origin(ep)} fails with {type(exc).__name__}: {exc}"
        why = _not_a_plugin(obj, ep.name)
        if why is not None:
            return f"plugin {ep.name!r} is not a gateway plugin: {_origin(ep)}: {why}"
        return cast(type[Plugin], obj)


@functools.cache
def registry() -> Registry:
    """The process's registry: entry points are read once (a restart picks up newly installed packages)."""
    return Registry.discover()
