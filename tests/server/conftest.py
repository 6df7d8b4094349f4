"""Fixtures: the shared live gateway on the tiny model (routes in gateway_support), HTTP clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest
from gateway_support import ADMIN_KEY, CLIENT_KEY, Gateway, serve_app, tiny_engine

from draftgate.engine import DrafterKind
from draftgate.models.loader import LoadedModel
from draftgate.server import AuthConfig, Route, RouteTable, create_app


@pytest.fixture(scope="session")
def gateway(tiny_model: LoadedModel) -> Iterator[Gateway]:
    routes = RouteTable.of(
        [
            Route("tiny", tiny_engine(tiny_model, DrafterKind.AUTO), model="tiny"),
            Route("tiny-ngram", tiny_engine(tiny_model, DrafterKind.NGRAM, k=4), model="tiny"),
            Route("tiny-plain", tiny_engine(tiny_model, DrafterKind.NONE), model="tiny"),
            Route("tiny-tight", tiny_engine(tiny_model, DrafterKind.NONE, max_batch=1, max_queue=1), model="tiny"),
            Route("tiny-broken", tiny_engine(tiny_model, DrafterKind.NONE), model="tiny"),
        ]
    )
    auth = AuthConfig(api_keys=frozenset({CLIENT_KEY}), admin_keys=frozenset({ADMIN_KEY}))
    app = create_app(routes, auth)
    try:
        with serve_app(app) as url:
            yield Gateway(url, routes, app)
    finally:
        routes.close()


@pytest.fixture
def http(gateway: Gateway) -> Iterator[httpx.Client]:
    with gateway.http() as c:
        yield c


@pytest.fixture
def after_check(gateway: Gateway, http: httpx.Client) -> Iterator[Callable[[], None]]:
    """At teardown: a normal request still works and nothing leaked on any route."""

    def check() -> None:
        r = http.post("/v1/completions", json={"model": "tiny-plain", "prompt": "hello world", "max_tokens": 3})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] >= 1
        gateway.all_idle_no_leaks()

    yield check
    check()
