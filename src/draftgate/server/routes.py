"""The route table: exposed model name -> a back end and its speculation switch.

A back end is a ``draftgate.engine.Backend``: the ``Engine`` over any round target, or
``VllmPluginBackend``. Back end addresses come only from the server's configuration (the
routes file or flags), never from a request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from draftgate.engine import Backend

__all__ = ["Backend", "Route", "RouteTable", "ROUTE_NAME_RE"]

ROUTE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")


@dataclass
class Route:
    """One exposed model. ``enabled`` switches speculation (not the route): off = plain decoding."""

    name: str
    engine: Backend
    enabled: bool = True
    model: str = ""  # where the weights came from, for /v1/models
    context_length: int | None = None  # prompt + completion tokens the back end accepts
    canary_fraction: float = 1.0  # of requests that speculate while enabled (the rest: plain control arm)
    shadow_fraction: float = 0.0  # of requests replayed through the drafter while speculation is off

    def __post_init__(self) -> None:
        if not ROUTE_NAME_RE.match(self.name):
            raise ValueError(
                f"route name {self.name!r} must be 1-128 characters of letters, digits and ._:/@+- "
                "(starting with a letter or digit)"
            )
        for f in ("canary_fraction", "shadow_fraction"):
            x = getattr(self, f)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.0 <= x <= 1.0:
                raise ValueError(f"route {self.name!r}: {f} must be a number in [0, 1], got {x!r}")
        if self.context_length is None:
            self.context_length = self.engine.max_context
        self.set_enabled(self.enabled)

    def set_enabled(self, on: bool) -> None:
        """The per-route switch (and the admin kill switch): takes effect from the next round."""
        self.enabled = bool(on)
        self.engine.speculation_enabled = self.enabled and self.engine.drafter is not None

    @property
    def speculative(self) -> bool:
        return self.engine.speculation_enabled

    @property
    def drafter_name(self) -> str:
        d = self.engine.drafter
        return d.name if d is not None else "none"


@dataclass
class RouteTable:
    routes: dict[str, Route] = field(default_factory=dict)

    @classmethod
    def of(cls, routes: Iterable[Route]) -> RouteTable:
        table = cls()
        for r in routes:
            if r.name in table.routes:
                raise ValueError(f"two routes are named {r.name!r}; route names must be unique")
            table.routes[r.name] = r
        if not table.routes:
            raise ValueError("the route table is empty; declare at least one route")
        return table

    def get(self, name: str) -> Route | None:
        return self.routes.get(name)

    def __iter__(self) -> Iterator[Route]:
        return iter(self.routes.values())

    def __len__(self) -> int:
        return len(self.routes)

    @property
    def names(self) -> list[str]:
        return list(self.routes)

    def _engines(self) -> list[Backend]:
        seen: dict[int, Backend] = {}
        for r in self:
            seen.setdefault(id(r.engine), r.engine)
        return list(seen.values())

    def close(self) -> None:
        """Stop every back end (the owner of the table calls this once, after serving)."""
        for e in self._engines():
            e.shutdown()
