"""The admin API (admin keys only: 401 without a key, 403 with a client key).

    GET  /admin/routes          every route: switch, drafter, K policy, fractions, live stats,
                                canary arms and last rollback reason, shadow predictions,
                                lossless canary results
    POST /admin/routes/{name}   {"enabled": bool, "canary_fraction": x, "shadow_fraction": x,
                                 "lossless_fraction": x} (any subset): applied at once, no restart

Turning speculation off is the kill switch: requests in flight decode plainly
from their next round, new requests plainly from the start.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Request

from draftgate.server.api_errors import APIError
from draftgate.server.auth import AuthConfig, require_admin
from draftgate.server.ops.state import Ops

__all__ = ["admin_router"]

_FIELDS = ("enabled", "canary_fraction", "shadow_fraction", "lossless_fraction")


def admin_router(ops: Ops, auth: AuthConfig) -> APIRouter:
    router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin(auth))])

    @router.get("/routes")
    async def list_routes() -> dict[str, Any]:
        return {"object": "list", "data": [ro.snapshot() for ro in ops.routes.values()]}

    @router.get("/routes/{name:path}")
    async def get_route(name: str) -> dict[str, Any]:
        return _find(ops, name).snapshot()

    @router.post("/routes/{name:path}")
    async def update_route(name: str, request: Request) -> dict[str, Any]:
        ro = _find(ops, name)
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            raise APIError(400, "the body must be a JSON object", code="invalid_json") from None
        if not isinstance(body, dict) or not body:
            raise APIError(400, f"the body must be a JSON object with some of {list(_FIELDS)}", code="invalid_value")
        unknown = sorted(set(body) - set(_FIELDS))
        if unknown:
            raise APIError(
                400, f"unknown field(s) {unknown}; allowed: {list(_FIELDS)}", param=unknown[0], code="invalid_value"
            )
        try:
            ops.update(name, body)
        except ValueError as e:
            raise APIError(400, str(e), code="invalid_value") from None
        return ro.snapshot()

    return router


def _find(ops: Ops, name: str) -> Any:
    if name not in ops.routes:
        raise APIError(404, f"no route named {name!r}; routes: {', '.join(ops.routes)}", code="route_not_found")
    return ops[name]
