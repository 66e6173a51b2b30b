"""A plugin declares every context field it reads that another plugin provides, and every one it sets, so that
the route check holds.

The route check (gateway/config.py, `contract_problems`) refuses a chain whose plugins are listed in an
order that cannot run, but it knows only what each plugin declares. A plugin that reads a field without
declaring it passes in any order and then reads nothing there: `idempotency` listed before `auth` kept
every tenant's keys as one (a second tenant's submit got the first one's task, replayed).

`test_every_plugin_declares_each_provided_field_it_reads_and_each_field_it_sets` finds the reads (and
writes) in the plugins' source with `ast`, not by running them: a plugin reads most such fields on one
branch only (the outbox reads `json` only when the upstream is down, on a write route in `mode: outbox`),
so a run would see what its scenarios happen to reach, and nothing of a plugin added later. What counts as a read:

- `<ctx>.<field>` loaded anywhere in the plugin's module (every module of its package, for a package),
  where `<ctx>` is a name called `ctx`, a parameter annotated `RequestContext`, or an attribute that a
  class of the plugin annotates `RequestContext` (the events subscriber's `origin`);
- `<ctx>.<method>` of a `RequestContext` method or property that itself reads such a field
  (`tenant_key` reads `tenant`), found the same way in gateway/context.py; `read_body` alone is exempt:
  it reads the body itself when no plugin did, which is why a plugin calling it needs nobody.

The fields that count are those some plugin provides or sets (declared `provides`/`defaults`, or
assigned as `<ctx>.<field> = ...` in a plugin). A plugin that assigns a field must declare it in its own
`provides` or `defaults`: undeclared, the check cannot see that a later plugin (or the upstream call,
which sends `query`) depends on the order. A plugin's declarations are the union of its contracts
with its default settings on a read route and on a write route (its class-level `needs`/`provides` when
its settings have required keys): a read or a write must be declared by at least one use. Reads by code
outside the plugin's package that it hands the context to (the route's upstream call, another route's answer
view) are that code's. The upstream call's reads are checked the same way by
`test_the_upstream_call_reads_no_provided_field_but_its_need_and_those_it_goes_without`: each is the
route's `policy.needs` or one it goes without (`CALL_READS`, each with its reason).
"""
from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from exports_common.config_loader import ConfigError
from gateway import context
from gateway.plugin_registry import registry
from gateway.plugins.base import Contract, Plugin
from gateway.policy import RoutePolicy
from gateway.policy.circuit_breaker import RouteBreakerSettings
from gateway.policy.retry import RetrySettings
from gateway.testing import PluginHarness
from tests.conftest import gateway_config
from tests.procs import ROOT

pytestmark = pytest.mark.inprocess  # no server process: the one `run` below refuses to start

CONTEXT = "RequestContext"
# context methods that read a provided field but depend on no plugin for it
SELF_SERVED = {"read_body": "reads the request body itself when no earlier plugin did"}
USES = (("GET",), ("POST",))


def _sources(plugin: type[Plugin]) -> list[Path]:
    """The plugin's module, or every module of its package when it is defined in the package's __init__."""
    path = Path(inspect.getfile(plugin))
    return sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]


def _context_names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The names (parameters) and attribute names (class fields) that hold a request context in `tree`."""
    names, attributes = {"ctx"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and _is_context(node.annotation):
            names.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _is_context(node.annotation):
            attributes.add(node.target.id)
    return names, attributes


def _is_context(annotation: ast.expr | None) -> bool:
    return (isinstance(annotation, ast.Name) and annotation.id == CONTEXT) or \
        (isinstance(annotation, ast.Constant) and annotation.value == CONTEXT)


def _attributes_of(tree: ast.AST, holds_context: set[str], held_as: set[str]) -> list[ast.Attribute]:
    """Each `<ctx>.<name>` in `tree`, loaded or stored."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id in holds_context) or \
                (isinstance(owner, ast.Attribute) and owner.attr in held_as):
            found.append(node)
    return found


def _context_reads(trees: list[ast.Module]) -> tuple[set[str], set[str]]:
    """The context attributes the code in `trees` loads (fields and methods) and the fields it assigns."""
    loads: set[str] = set()
    stores: set[str] = set()
    for tree in trees:
        names, attributes = _context_names(tree)
        for node in _attributes_of(tree, names, attributes):
            (stores if isinstance(node.ctx, ast.Store) else loads).add(node.attr)
    return loads, stores


def _parsed(paths: list[Path]) -> list[ast.Module]:
    return [ast.parse(path.read_text(), str(path)) for path in paths]


def _declared(plugin: type[Plugin]) -> Contract:
    """The union of the plugin's contracts with its default settings, on a read route and on a write route."""
    try:
        settings = plugin.Settings()
    except ValidationError:  # settings it cannot go without: what its class declares
        return Contract(needs=plugin.needs, provides=plugin.provides)
    uses = [plugin.contract(settings, methods) for methods in USES]
    return Contract(needs=frozenset().union(*(u.needs for u in uses)),
                    provides=frozenset().union(*(u.provides for u in uses)),
                    defaults=frozenset().union(*(u.defaults for u in uses)))


def _method_reads(provided: set[str]) -> dict[str, set[str]]:
    """Each `RequestContext` method or property that reads a provided field (`self.<field>`), with those fields."""
    [cls] = [n for n in ast.parse(Path(inspect.getfile(context)).read_text()).body
             if isinstance(n, ast.ClassDef) and n.name == CONTEXT]
    reads = {}
    for member in cls.body:
        if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fields = {a.attr for a in _attributes_of(member, {"self"}, set())
                      if isinstance(a.ctx, ast.Load)} & provided
            if fields:
                reads[member.name] = fields
    return reads


def _plugins() -> list[type[Plugin]]:
    """Every plugin a route may name whose source is in this repository: the built-ins and the example's."""
    found = []
    for name in registry().names():
        plugin = registry().resolve(name)
        if not isinstance(plugin, str) and Path(inspect.getfile(plugin)).resolve().is_relative_to(ROOT):
            found.append(plugin)
    return found


def test_every_plugin_declares_each_provided_field_it_reads_and_each_field_it_sets() -> None:
    plugins = _plugins()
    assert {"auth", "idempotency", "outbox", "events", "tenant_allowlist"} <= {p.name for p in plugins}
    reads = {p.name: _context_reads(_parsed(_sources(p))) for p in plugins}
    declared = {p.name: _declared(p) for p in plugins}
    provided = set().union(*(d.provides | d.defaults for d in declared.values()),
                           *(stores for _, stores in reads.values()))
    assert {"tenant", "task_id", "body", "json", "query"} <= provided
    through = _method_reads(provided)
    assert through["tenant_key"] == {"tenant"} and SELF_SERVED.keys() <= through.keys()
    problems = []
    for plugin in plugins:
        loads, stores = reads[plugin.name]
        read = (loads & provided) | set().union(*(through[m] for m in loads & through.keys() - SELF_SERVED.keys()))
        own = declared[plugin.name]
        for field in sorted(read - own.needs - own.provides - own.defaults):
            problems.append(f"{plugin.name} reads ctx.{field} but does not declare it in `needs` "
                            f"({inspect.getfile(plugin)})")
        for field in sorted(stores - own.provides - own.defaults):
            problems.append(f"{plugin.name} sets ctx.{field} but does not declare it in `provides` or `defaults` "
                            f"({inspect.getfile(plugin)})")
    assert problems == []
    # the finder sees what it is meant to: reads the contracts declare, through a method and through a class field
    assert "tenant" in reads["idempotency"][0] and "json" in reads["outbox"][0]
    assert "tenant_key" in reads["stale_if_error"][0] and "tenant" in reads["events"][0]
    assert "query" in reads["signed_download"][1] and "task_id" in reads["idempotency"][1]


# The route's upstream call (its policy, the proxy and the headers it sends) runs after every plugin. Each
# field a plugin provides that the call reads is the policy's declared need, or one the call goes without:
UPSTREAM_CALL = [*sorted((ROOT / "gateway/policy").glob("*.py")), *(ROOT / "gateway" / f"{name}.py"
                                                                      for name in ("proxy", "headers"))]
CALL_READS = {
    "task_id": "policy.retry's need on a write route (RoutePolicy.needs): a write is retried only by its id",
    "tenant": "the breaker's, read only on a route where a plugin provides it (circuit_breaker.breaker_of)",
    "query": "the query sent upstream; None (no plugin set it) sends the client's",
    "body": "the bytes a plugin read; None (no plugin read them) streams the request's own body",
}


def test_the_upstream_call_reads_no_provided_field_but_its_need_and_those_it_goes_without() -> None:
    provided = set().union(*(d.provides | d.defaults for d in map(_declared, _plugins())))
    loads, stores = _context_reads(_parsed(UPSTREAM_CALL))
    through = _method_reads(provided)
    read = (loads & provided) | set().union(*(through[m] for m in loads & through.keys() - SELF_SERVED.keys()))
    assert read == CALL_READS.keys(), "a field the call reads is declared in RoutePolicy.needs or listed here"
    assert stores & provided == set(), "the call sets only its own fields (timeouts, deadline, attempt...)"
    assert RoutePolicy(retry=RetrySettings()).needs(("POST",)) == {"task_id"}
    assert RoutePolicy(retry=RetrySettings(), circuit_breaker=RouteBreakerSettings()).needs(("GET",)) == set()


def _submit_plugins(config: dict[str, Any], order: list[str]) -> None:
    """The submit route's plugins, as shipped, in `order` (by name)."""
    [submit] = [r for r in config["routes"] if r["name"] == "submit"]
    by_name = {p if isinstance(p, str) else next(iter(p)): p for p in submit["plugins"]}
    submit["plugins"] = [by_name[name] for name in order]


def gateway_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


NEEDS_AUTH_FIRST = ("route `submit`: idempotency needs `tenant`, which auth provides, but auth is listed after it: "
                    "list auth before idempotency")


def _submit_route_file(tmp_path: Path, plugins: list[str]) -> Path:
    """A gateway config file whose submit route lists `plugins`, in this order."""
    config = gateway_config(tmp_path, "http://127.0.0.1:9")
    _submit_plugins(config, plugins)
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_a_gateway_listing_idempotency_before_auth_is_refused_by_check_config_and_at_start(
        tmp_path: Path) -> None:
    path = _submit_route_file(tmp_path, ["rate_limit", "validate", "idempotency", "auth", "task_id", "outbox"])
    checked = gateway_command("check-config", str(path))
    assert checked.returncode == 2, checked.stdout + checked.stderr
    assert NEEDS_AUTH_FIRST in checked.stderr, checked.stderr
    assert "routes[0].plugins[2].idempotency (line " in checked.stderr, checked.stderr
    # the server itself refuses to start on it (a config it accepted would serve until the timeout: a failure)
    started = gateway_command("run", "--config", str(path))
    assert started.returncode == 2 and NEEDS_AUTH_FIRST in started.stderr, started.stdout + started.stderr


def test_a_gateway_listing_validate_after_the_outbox_is_refused_naming_both_fields(tmp_path: Path) -> None:
    path = _submit_route_file(tmp_path, ["rate_limit", "auth", "idempotency", "task_id", "outbox", "validate"])
    checked = gateway_command("check-config", str(path))
    assert checked.returncode == 2, checked.stdout + checked.stderr
    for field in ("body", "json"):
        assert (f"route `submit`: outbox needs `{field}`, which validate provides, but validate is listed after it: "
                f"list validate before outbox") in checked.stderr, checked.stderr


KEYS = {"acme": "acme-key-0123456789", "globex": "globex-key-0123456789"}
SUBMIT = [{"idempotency": {"ttl_sec": 60}}, {"task_id": {"action": "generate", "prefix": "exp"}}]


async def test_idempotency_before_auth_cannot_be_built_and_after_it_keys_stay_per_tenant() -> None:
    with pytest.raises(ConfigError, match="idempotency needs `tenant`, which auth provides"):
        PluginHarness([SUBMIT[0], "auth", SUBMIT[1]], tenants=KEYS, methods=("POST",))
    async with PluginHarness(["auth", *SUBMIT], tenants=KEYS, methods=("POST",)) as gw:
        key = {"Idempotency-Key": "same-key"}
        first = await gw.request("POST", "/test/x", json_body={"x": 1}, api_key=KEYS["acme"], headers=key)
        again = await gw.request("POST", "/test/x", json_body={"x": 1}, api_key=KEYS["acme"], headers=key)
        other = await gw.request("POST", "/test/x", json_body={"x": 1}, api_key=KEYS["globex"], headers=key)
    assert first.status == again.status == other.status == 202
    assert again.headers.get("idempotent-replayed") == "true"
    assert again.headers["location"] == first.headers["location"]
    assert "idempotent-replayed" not in other.headers and other.upstream is not None
    assert other.upstream.tenant == "globex" and other.headers["location"] != first.headers["location"]
