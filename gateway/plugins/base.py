"""What every plugin is: its settings, its contract with the other plugins, and its hooks.

Like a Starlette middleware, a plugin wraps the next handler: it may act before
calling it, after it, or answer without calling it at all. Plugins never import
each other; they cooperate only through typed fields of `RequestContext`, and
each says which of them it `needs` (set by an earlier plugin) and which it
`provides` (sets before calling the next). The chain builder checks every route
against these declarations when the config is loaded.

A plugin also owns everything else about itself: its state (`services.state.kv`,
`services.state.shared`), its counters (`services.metrics.tally`), its background
work, its gauges and its part of /admin/stats, through the class-level hooks
below. Nothing outside the plugin's module names it but the registry.

A `Gatekeeper` (rate_limit, auth, task_id) only decides whether a request goes on,
mostly without an await. It says so in `admit`, and the chain runs consecutive
gatekeepers as one handler (`Gatekeepers`): a request they all admit reaches the
handler after them through one coroutine instead of one per plugin.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, ClassVar, Coroutine, Generic, Sequence, TypeVar

from pydantic import BaseModel, ConfigDict

from gateway.answer_view import AnswerView
from gateway.context import Handler, RequestContext
from gateway.response import GatewayResponse
from gateway.services import Services


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Contract:
    """What one use of a plugin (its settings, on a route with these methods) needs and sets on the context.

    `needs`: fields an earlier plugin must provide. `provides`: fields it sets before calling
    the next. `defaults`: fields it sets only when no earlier plugin did, so a plugin that
    `provides` one of them must come first. `agrees`: values every plugin of the route that
    names the same key must give alike (e.g. the prefix of task ids). `terminal`: it answers
    every request itself and never calls the next handler, so it must be listed last.
    `routes`: other routes it refers to by name, checked to exist and serve GET.
    """

    needs: frozenset[str] = frozenset()
    provides: frozenset[str] = frozenset()
    defaults: frozenset[str] = frozenset()
    agrees: tuple[tuple[str, object], ...] = ()
    terminal: bool = False
    # routes this use names (the route whose answers a stream carries): each must exist and serve GET
    routes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RouteInfo:
    """The route a plugin instance serves: its name (the metrics label) and its upstream call.

    `call_upstream` is the route's upstream call (its policy and breaker around the proxy,
    gateway/policy/): a plugin that makes a call of its own (rerun) goes through it.
    `view_of` gives another route's answer view (a stream carries the status route's answers).
    """

    name: str
    upstream: str
    methods: tuple[str, ...]
    call_upstream: Handler
    # another route's answer for a task the gateway asks about itself (gateway/answer_view.py), by route name
    view_of: Callable[[str], AnswerView] | None = None


S = TypeVar("S", bound=Settings)
CurrentServices = Callable[[], Services]


class PluginBase(ABC, Generic[S]):
    """The plugin protocol, with a default for every hook and the constructor most plugins need.

    A plugin subclasses it, sets `name` and `Settings`, and defines
    `async def __call__(self, ctx: RequestContext) -> GatewayResponse`.
    """

    name: ClassVar[str]
    Settings: ClassVar[type[Any]]  # its own pydantic model (a subclass of base.Settings)
    # fields a plugin sets or needs whatever its settings; `contract` may refine them per use
    needs: ClassVar[frozenset[str]] = frozenset()
    provides: ClassVar[frozenset[str]] = frozenset()
    # it answers every request itself (a handler, not a filter): the route's check wants it listed last
    terminal_handler: ClassVar[bool] = False
    # it only decides whether a request may go on (who calls, how often, which id) and never changes an
    # answer: a stream runs it once, when it opens on its own route, and a route's answer view leaves it out
    gatekeeper: ClassVar[bool] = False

    def __init__(self, next: Handler, settings: S, services: Services, route: RouteInfo) -> None:
        self.next = next
        self.settings = settings
        self.services = services
        self.route = route.name

    @abstractmethod
    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        """Handle one request: act, call `self.next(ctx)` (or not), act on its answer."""

    @classmethod
    def contract(cls, settings: Any, methods: tuple[str, ...]) -> Contract:
        return Contract(needs=cls.needs, provides=cls.provides, terminal=cls.terminal_handler)

    @classmethod
    def background(cls, current: CurrentServices) -> list[Coroutine[Any, Any, None]]:
        """Long-running work for the life of the process; `current()` is the services in force."""
        return []

    @classmethod
    def observe(cls, services: Services) -> None:
        """Register the gauges read at scrape time (once per process)."""

    @classmethod
    async def before_scrape(cls, services: Services) -> None:
        """Refresh what a gauge can only read by awaiting (a store's size), just before /metrics."""

    @classmethod
    def accepts(cls, settings: Any) -> dict[str, Any]:
        """What these settings say the gateway accepts, for the OpenAPI document (`export_types`,
        `max_timeout_sec` of a submit body)."""
        return {}

    @classmethod
    def deprecations(cls, settings: Any) -> list[str]:
        """Settings that still load but should be written otherwise, one sentence each naming the new way (said
        by check-config, at start and on reload)."""
        return []

    @classmethod
    async def stats(cls, services: Services) -> dict[str, Any]:
        """This plugin's part of /admin/stats (merged into the answer's top level)."""
        return {}


Plugin = PluginBase[Any]


class Gatekeeper(PluginBase[S]):
    """A plugin that only decides whether a request goes on, saying so in `admit` (no await for most requests).

    It subclasses this instead of `PluginBase` and defines `admit` instead of `__call__`.
    """

    gatekeeper: ClassVar[bool] = True

    @abstractmethod
    def admit(self, ctx: RequestContext) -> Awaitable[GatewayResponse] | None:
        """None: the request goes on to the next handler, and nothing of this plugin is left to do before or after
        it. Else the request's answer, to await: a refusal, or the next handler's answer with what this plugin
        does around it (an await before, headers added after). Raising `ApiError` refuses too."""

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        answer = self.admit(ctx)
        return await (self.next(ctx) if answer is None else answer)


class Gatekeepers:
    """Consecutive gatekeepers of a chain, outermost first, run as one handler.

    A request each admits goes straight to the handler after the last. One whose `admit` answers (or goes on
    only after an await) continues through that gatekeeper's own `next`: the rest of the chain runs as it does
    plugin by plugin.
    """

    def __init__(self, gates: Sequence[Gatekeeper[Any]]) -> None:
        self.gates = tuple(gates)
        self.admits = tuple(gate.admit for gate in gates)
        self.next = gates[-1].next

    async def __call__(self, ctx: RequestContext) -> GatewayResponse:
        for admit in self.admits:
            answer = admit(ctx)
            if answer is not None:
                return await answer
        return await self.next(ctx)


def gatekeepers(gates: Sequence[Gatekeeper[Any]], outermost: Handler) -> Handler:
    """The handler that runs `gates`, consecutive in a chain and outermost first: one `Gatekeepers` for two or
    more, else `outermost` (the first of them, or the handler after them when there are none)."""
    return Gatekeepers(gates) if len(gates) > 1 else outermost
