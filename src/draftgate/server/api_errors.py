"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``, with the right status.

Every failure the gateway answers goes through ``APIError`` (raised by handlers and
dependencies) or one of the handlers installed here (FastAPI's own 422 becomes 400;
404/405 from routing and unexpected exceptions keep the same shape).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["APIError", "error_body", "from_validation_errors", "install_error_handlers"]

log = logging.getLogger("draftgate.server")

_TYPE_BY_STATUS = {401: "invalid_request_error", 403: "permission_error", 429: "rate_limit_error"}


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class APIError(Exception):
    """An error answer: HTTP status plus OpenAI's error object (and optional headers)."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _param(loc: Sequence[int | str]) -> str | None:
    """pydantic's location -> OpenAI's param: ('messages', 0, 'content', 'str') -> 'messages[0].content'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("body",) and not out:
            continue
        elif "[" in part or part in ("str", "int", "float", "bool", "list", "dict"):
            break  # a union branch name, not a field
        else:
            out += f".{part}" if out else part
    return out or None


def from_validation_errors(errors: Sequence[Mapping[str, Any]]) -> APIError:
    """The first pydantic error as a 400; the input value is never echoed back."""
    if not errors:
        return APIError(400, "invalid request")
    e = errors[0]
    kind = str(e.get("type", ""))
    param = _param(tuple(e.get("loc", ())))
    msg = str(e.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind == "json_invalid":
        return APIError(400, f"We could not parse the JSON body of your request: {msg}", code="invalid_json")
    if kind == "missing":
        return APIError(400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    if param is None:
        return APIError(400, f"Invalid request body: {msg}")
    return APIError(400, f"Invalid value for '{param}': {msg}", param=param, code="invalid_value")


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return exc.response()

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return from_validation_errors(list(exc.errors())).response()

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return APIError(exc.status_code, str(exc.detail), headers=exc.headers).response()

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return APIError(500, f"internal server error: {type(exc).__name__}").response()

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
