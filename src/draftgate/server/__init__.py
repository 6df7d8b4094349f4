"""The serving layer: the OpenAI-compatible gateway (routes, auth, wire models, SSE, metrics)."""

from draftgate.server.app import create_app
from draftgate.server.auth import AuthConfig
from draftgate.server.routes import Backend, Route, RouteTable

__all__ = ["AuthConfig", "Backend", "Route", "RouteTable", "create_app"]
