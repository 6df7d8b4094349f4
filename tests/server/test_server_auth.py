"""Bearer keys: 401 without or with a wrong key; open dev mode without keys; admin keys apart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from fastapi import Depends
from gateway_support import ADMIN_KEY, CLIENT_KEY, Gateway, serve_app, tiny_engine

from draftgate.engine import DrafterKind
from draftgate.models.loader import LoadedModel
from draftgate.server import AuthConfig, Route, RouteTable, create_app
from draftgate.server.auth import parse_keys, read_keys_file, require_admin

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer sk-wrong-0123456789"},
        {"Authorization": f"Basic {CLIENT_KEY}"},
        {"Authorization": "Bearer"},
        {"Authorization": CLIENT_KEY},
    ],
    ids=["none", "wrong", "basic", "empty", "no-scheme"],
)
def test_401_without_a_valid_key(gateway: Gateway, headers: dict[str, str]) -> None:
    with httpx.Client(base_url=gateway.url, headers=headers) as c:
        for method, path, body in [("POST", "/v1/chat/completions", BODY), ("GET", "/v1/models", None)]:
            r = c.request(method, path, json=body)
            assert r.status_code == 401, r.text
            assert r.headers["WWW-Authenticate"] == "Bearer"
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"}
            assert err["code"] in ("missing_api_key", "invalid_api_key")


def test_401_comes_before_body_parsing(gateway: Gateway) -> None:
    with httpx.Client(base_url=gateway.url) as c:
        r = c.post("/v1/chat/completions", content=b"{not json")
    assert r.status_code == 401


def test_openai_client_with_wrong_key(gateway: Gateway) -> None:
    with gateway.openai(key="sk-wrong-0123456789") as client, pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_valid_keys_pass(gateway: Gateway) -> None:
    for key in (CLIENT_KEY, ADMIN_KEY):
        with gateway.http(key) as c:
            assert c.post("/v1/chat/completions", json=BODY).status_code == 200


@pytest.fixture(scope="module")
def open_gateway(tiny_model: LoadedModel) -> Iterator[str]:
    """No keys at all: dev mode, every request allowed; the admin API closed."""
    routes = RouteTable.of([Route("tiny", tiny_engine(tiny_model, DrafterKind.NONE))])
    app = create_app(routes, AuthConfig())
    admin = require_admin(AuthConfig(api_keys=frozenset({CLIENT_KEY}), admin_keys=frozenset({ADMIN_KEY})))

    @app.get("/admin/ping", dependencies=[Depends(admin)])
    async def ping() -> dict[str, str]:  # a stand-in for the admin API
        return {"ok": "yes"}

    try:
        with serve_app(app) as url:
            yield url
    finally:
        routes.close()


def test_dev_mode_is_open(open_gateway: str) -> None:
    with httpx.Client(base_url=open_gateway) as c:
        assert c.post("/v1/chat/completions", json=BODY).status_code == 200
        assert c.get("/v1/models").json()["data"][0]["id"] == "tiny"


def test_admin_dependency(open_gateway: str) -> None:
    with httpx.Client(base_url=open_gateway) as c:
        assert c.get("/admin/ping").status_code == 401
        assert c.get("/admin/ping", headers={"Authorization": "Bearer sk-wrong-0123456789"}).status_code == 401
        r = c.get("/admin/ping", headers={"Authorization": f"Bearer {CLIENT_KEY}"})
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
        assert c.get("/admin/ping", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json() == {"ok": "yes"}


def test_keys_files(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("# client keys\nsk-aaaaaaaa1\n\n  sk-bbbbbbbb2  # second\n")
    assert read_keys_file(f) == {"sk-aaaaaaaa1", "sk-bbbbbbbb2"}
    assert parse_keys(["sk-aaaaaaaa1, sk-bbbbbbbb2"], "env") == {"sk-aaaaaaaa1", "sk-bbbbbbbb2"}
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ValueError, match="no keys"):
        read_keys_file(tmp_path / "empty")
    with pytest.raises(ValueError, match="at least"):
        parse_keys(["short"], "env")
    with pytest.raises(ValueError, match="cannot read"):
        read_keys_file(tmp_path / "missing")
