"""The gateway config's older shape, read into the current one.

In the older shape `timeout`, `retry` and `circuit_breaker` were entries of a
route's `plugins:` list (run around the proxy whatever their place), and the
breaker's settings were repeated, equal, on every route to an upstream. Such a
file still loads: `upgrade` moves them to `routes[].policy.timeout`,
`routes[].policy.retry` and `upstreams.<name>.circuit_breaker`, and the load says
so in one warning. A route that did not list the breaker while others to its
upstream did keeps out of it (`policy.circuit_breaker: {scope: none}`), as it was.
Routes that gave one upstream's breaker different settings were refused before
and still are, naming both routes: there is one breaker per upstream, so which
settings it should take is the operator's call.

`upgrade` works on the mapping as read, so `migrate-config` applies it to a
round-trip (ruamel.yaml) document and prints the file in the current shape with
its comments, anchors and layout.
"""
from __future__ import annotations

import copy
import io
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

from pydantic import BaseModel, ValidationError

from exports_common.config_loader import Loc, error_loc, error_message, located, problem
from gateway.policy.circuit_breaker import CircuitBreakerSettings

POLICY = ("timeout", "retry")
BREAKER = "circuit_breaker"
MOVED = (*POLICY, BREAKER)
MIGRATE = "python -m gateway migrate-config FILE"
M = TypeVar("M", bound=BaseModel)


@dataclass
class Upgrade:
    """What `upgrade` did: the warning to give, where each moved value came from, what it could not move."""

    warning: str = ""
    moved: dict[Loc, Loc] = field(default_factory=dict)
    problems: list[tuple[Loc, str]] = field(default_factory=list)

    def origin(self, loc: Loc) -> Loc:
        """Where the file holds what `loc` of the upgraded config names (its longest moved prefix)."""
        for n in range(len(loc), 0, -1):
            if loc[:n] in self.moved:
                return self.moved[loc[:n]] + loc[n:]
        return loc


def _entry(item: Any) -> tuple[str, Any] | None:
    """(name, settings) of a plugin entry as the YAML writes it, or None for a malformed one."""
    if isinstance(item, str):
        return item, None
    if isinstance(item, Mapping) and len(item) == 1:
        [(name, settings)] = item.items()
        return (name, settings) if isinstance(name, str) else None
    return None


def _moving(item: Any) -> tuple[str, Any] | None:
    """(name, settings) of a plugin entry that the current shape has elsewhere."""
    entry = _entry(item)
    return entry if entry is not None and entry[0] in MOVED else None


def _routes(data: Any) -> list[MutableMapping[str, Any]]:
    routes = data.get("routes") if isinstance(data, Mapping) else None
    return [r for r in routes if isinstance(r, MutableMapping)] if isinstance(routes, list) else []


def _plugins(route: Mapping[str, Any]) -> list[Any]:
    plugins = route.get("plugins")
    return plugins if isinstance(plugins, list) else []


def is_older_shape(data: Any) -> bool:
    return any(_moving(item) for route in _routes(data) for item in _plugins(route))


def _new_map(like: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """An empty mapping of the document's own kind (a round-trip document's keeps its layout)."""
    return type(like)()


def _policy(route: MutableMapping[str, Any]) -> Any:
    """The route's `policy` mapping, made when it has none (before its plugins, where a round-trip document
    keeps the blank line that ends the route after them)."""
    if "policy" not in route:
        policy = _new_map(route)
        insert = getattr(route, "insert", None)
        if insert is not None and "plugins" in route:
            insert(list(route).index("plugins"), "policy", policy)
        else:
            route["policy"] = policy
    return route["policy"]


def _breaker(settings: Any) -> CircuitBreakerSettings | None:
    """The settings as they will load (so that `{}` and the defaults written out compare equal)."""
    try:
        return CircuitBreakerSettings.model_validate(settings or {})
    except ValidationError:
        return None  # reported where the settings end up, at their place in the file


def upgrade(data: MutableMapping[str, Any]) -> Upgrade:
    """Move the policy plugins of every route of `data` (changed in place) to where the current shape has them."""
    done = Upgrade()
    # upstream -> (route index, plugin index, settings) of the first route that listed its breaker
    breakers: dict[str, tuple[int, int, Any]] = {}
    listed: set[int] = set()  # the routes that listed a breaker
    policy_routes: list[str] = []
    for i, route in enumerate(_routes(data)):
        plugins = _plugins(route)
        moved = {k: entry for k, item in enumerate(plugins) if (entry := _moving(item))}
        kept = [k for k in range(len(plugins)) if k not in moved]
        done.moved.update({("routes", i, "plugins", to): ("routes", i, "plugins", k) for to, k in enumerate(kept)})
        for k, (name, settings) in moved.items():
            if name == BREAKER:
                listed.add(i)
                _upstream_breaker(data, i, k, settings, breakers, done)
            elif _to_policy(route, name, settings, ("routes", i, "plugins", k, name), done):
                done.moved[("routes", i, "policy", name)] = ("routes", i, "plugins", k, name)
                if route.get("name") not in policy_routes:
                    policy_routes.append(str(route.get("name")))
        for k in reversed(moved):
            del plugins[k]
    upstreams = data.get("upstreams")
    for upstream, (i, k, settings) in breakers.items():
        if isinstance(upstreams, MutableMapping) and isinstance(upstreams.get(upstream), MutableMapping):
            upstreams[upstream][BREAKER] = settings if settings is not None else _new_map(data)
            done.moved[("upstreams", upstream, BREAKER)] = ("routes", i, "plugins", k, BREAKER)
    kept_out = _keep_out(data, breakers, listed)
    done.warning = _warning(policy_routes, sorted(breakers), kept_out)
    return done


def _to_policy(route: MutableMapping[str, Any], name: str, settings: Any, at: Loc, done: Upgrade) -> bool:
    policy = _policy(route)
    if not isinstance(policy, MutableMapping) or name in policy:
        done.problems.append((at, f"route `{route.get('name')}`: {name} is listed as a plugin and given under "
                                  f"policy too; keep policy.{name} only"))
        return False
    policy[name] = settings if settings is not None else _new_map(route)
    return True


def _upstream_breaker(data: MutableMapping[str, Any], i: int, k: int, settings: Any,
                      breakers: dict[str, tuple[int, int, Any]], done: Upgrade) -> None:
    """Note route i's breaker as its upstream's, or why it cannot be."""
    routes = _routes(data)
    route = routes[i]
    upstream = str(route.get("upstream"))
    at: Loc = ("routes", i, "plugins", k, BREAKER)
    upstreams = data.get("upstreams")
    if upstream not in breakers and isinstance(upstreams, Mapping) and isinstance(upstreams.get(upstream), Mapping) \
            and BREAKER in upstreams[upstream]:
        done.problems.append((at, f"route `{route.get('name')}`: circuit_breaker is listed as a plugin, and "
                                  f"upstreams.{upstream}.circuit_breaker is set too; keep the upstream's only"))
        return
    first = breakers.setdefault(upstream, (i, k, settings))
    mine, theirs = _breaker(settings), _breaker(first[2])
    if mine is not None and theirs is not None and mine != theirs:
        done.problems.append((at, f"routes {routes[first[0]].get('name')!r} and {route.get('name')!r} configure "
                                  f"circuit_breaker of upstream {upstream!r} differently; a breaker is upstream "
                                  f"config: set it once under upstreams.{upstream}.circuit_breaker, and give a "
                                  f"route a breaker of its own with policy.circuit_breaker: {{scope: route, ...}}"))


def _keep_out(data: MutableMapping[str, Any], breakers: dict[str, tuple[int, int, Any]], listed: set[int]
              ) -> list[str]:
    """Routes to an upstream whose breaker other routes listed, which did not: kept out of it, as they were."""
    kept_out = []
    for i, route in enumerate(_routes(data)):
        if i in listed or str(route.get("upstream")) not in breakers:
            continue
        policy = _policy(route)
        if isinstance(policy, MutableMapping) and BREAKER not in policy:
            policy[BREAKER] = _new_map(route)
            policy[BREAKER]["scope"] = "none"
            kept_out.append(str(route.get("name")))
    return kept_out


def _warning(policy_routes: list[str], breakers: list[str], kept_out: list[str]) -> str:
    moves = []
    if policy_routes:
        moves.append(f"timeout and retry listed as plugins are read as the route's policy.timeout and policy.retry "
                     f"(routes {', '.join(policy_routes)})")
    if breakers:
        moves.append("circuit_breaker listed as a plugin is read as "
                     + ", ".join(f"upstreams.{name}.circuit_breaker" for name in breakers))
    if kept_out:
        moves.append(f"routes {', '.join(kept_out)}, which did not list it, keep out of their upstream's breaker "
                     "with policy.circuit_breaker: {scope: none}")
    return ("the config is in the older shape: " + "; ".join(moves) + f". Plugins now run in the order listed, "
            f"the upstream call last; `{MIGRATE}` prints the file in the current shape")


def load(data: Any, model: type[M], validate: Callable[[Any], M]) -> tuple[M, str]:
    """`validate(data)` on the upgraded copy of `data`, with every error pointed back at its place in the file."""
    data = copy.deepcopy(data)
    done = upgrade(data)
    if done.problems:
        raise located(model.__name__, done.problems)
    try:
        return validate(data), done.warning
    except ValidationError as exc:
        errors = [problem(done.origin(error_loc(err)), error_message(model, error_loc(err), err), err["input"])
                  for err in exc.errors()]
        raise ValidationError.from_exception_data(model.__name__, errors) from None


def migrated(text: str) -> str:
    """The YAML `text` of a config in the older shape, in the current one: comments, anchors, quotes and the
    layout kept (ruamel.yaml's round trip); `${NAME}` references stay as written."""
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096  # long lines stay as they are, not folded
    yaml.indent(mapping=2, sequence=4, offset=2)
    doc = yaml.load(text)
    done = upgrade(doc)
    if done.problems:
        raise located("GatewayConfig", done.problems)
    out = io.StringIO()
    yaml.dump(doc, out)
    return out.getvalue()
