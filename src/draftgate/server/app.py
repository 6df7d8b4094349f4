"""The OpenAI-compatible gateway: ``create_app(routes, auth)`` builds one FastAPI app.

Handlers are thin: parse and validate the body (wire), pick the route, encode the
prompt, submit, answer as JSON or SSE (generation). No module-level app or
engine: everything an app uses hangs off the arguments (and ``app.state``).

    POST /v1/chat/completions   POST /v1/completions   GET /v1/models
    GET /health                 GET /metrics
    GET /admin/routes           POST /admin/routes/{name}   (admin keys; see server/ops/admin.py)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.background import BackgroundTask

from draftgate.engine import Chunk, ChunkStream
from draftgate.errors import BadRequestError
from draftgate.models.tokenizer import Message
from draftgate.server.api_errors import APIError, install_error_handlers
from draftgate.server.auth import AuthConfig, require_client
from draftgate.server.generation import Job, collect, open_stream, sse_events
from draftgate.server.metrics import ServerMetrics
from draftgate.server.ops.admin import admin_router
from draftgate.server.ops.metrics import install_ops_metrics
from draftgate.server.ops.state import Finished, Ops, OpsConfig
from draftgate.server.render import Format
from draftgate.server.routes import Route, RouteTable
from draftgate.server.wire import MAX_BODY_BYTES, ChatRequest, CompletionRequest, parse_body
from draftgate.types import SamplingParams

__all__ = ["create_app", "DEFAULT_CHAT_MAX_TOKENS", "DEFAULT_COMPLETION_MAX_TOKENS"]

log = logging.getLogger("draftgate.server")

DEFAULT_CHAT_MAX_TOKENS = 1024  # when a chat request gives no max_tokens (capped by the context)
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def create_app(routes: RouteTable, auth: AuthConfig, ops_config: OpsConfig | None = None) -> FastAPI:
    if auth.open:
        log.warning("no API keys configured: /v1 is open to anyone who can reach it (dev mode)")
    metrics = ServerMetrics(routes)
    ops = Ops(routes, ops_config)
    install_ops_metrics(metrics.registry, ops)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield  # the back ends start with their first request; their owner (the CLI, a test) shuts them down
        ops.close()

    app = FastAPI(title="draftgate", summary="Lossless speculative decoding gateway", lifespan=lifespan)
    app.state.routes = routes
    app.state.metrics = metrics
    app.state.auth = auth
    app.state.ops = ops
    install_error_handlers(app)
    app.include_router(_openai_router(routes, metrics, ops, started), dependencies=[Depends(require_client(auth))])
    app.include_router(admin_router(ops, auth))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok"}  # no route names: /health needs no key

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    _install_openapi(app)
    return app


def _openai_router(routes: RouteTable, metrics: ServerMetrics, ops: Ops, started: int) -> APIRouter:
    router = APIRouter(prefix="/v1")

    @router.get("/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": r.name,
                    "object": "model",
                    "created": started,
                    "owned_by": "draftgate",
                    "speculative": {"enabled": r.speculative, "drafter": r.drafter_name},
                }
                for r in routes
            ],
        }

    @router.post("/chat/completions", openapi_extra=_body_schema(ChatRequest))
    async def chat_completions(request: Request) -> Response:
        req: ChatRequest = parse_body(await _read_body(request), ChatRequest)
        route = _route(routes, req.model)
        ids = _encode(metrics, route, req.to_messages(), raw=False)
        params = req.sampling_params(_max_new_tokens(route, req.requested_max_tokens(), len(ids), chat=True))
        fmt = Format(chat=True, model=route.name, include_usage=req.include_usage)
        return await _answer(request, metrics, ops, route, fmt, ids, params, req.streaming)

    @router.post("/completions", openapi_extra=_body_schema(CompletionRequest))
    async def completions(request: Request) -> Response:
        req: CompletionRequest = parse_body(await _read_body(request), CompletionRequest)
        route = _route(routes, req.model)
        prompt = req.prompt_input()
        ids = list(prompt) if isinstance(prompt, list) else _encode(metrics, route, prompt, raw=True)
        params = req.sampling_params(_max_new_tokens(route, req.requested_max_tokens(), len(ids), chat=False))
        fmt = Format(chat=False, model=route.name, include_usage=req.include_usage)
        return await _answer(request, metrics, ops, route, fmt, ids, params, req.streaming)

    return router


async def _answer(
    request: Request,
    metrics: ServerMetrics,
    ops: Ops,
    route: Route,
    fmt: Format,
    ids: list[int],
    params: SamplingParams,
    streaming: bool,
) -> Response:
    trace = metrics.trace(route)
    speculate = ops.choose(route)  # the kill switch and the canary's arms
    try:
        stream = open_stream(route, ids, params, speculate)
    except APIError as e:
        metrics.failure(route, "capacity" if e.status == 429 else "bad_request")
        raise
    job = Job(route, fmt, ids, trace, params, speculate, on_done=lambda j, c: _report(ops, j, c))
    if not streaming:
        return await _collect_unless_gone(request, job, stream)
    return StreamingResponse(
        sse_events(job, stream),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(stream.cancel),  # also if the body never started
    )


def _report(ops: Ops, job: Job, c: Chunk) -> None:
    """A request finished well: hand it to the ops layer (stats, canary, shadow, lossless)."""
    e2e, decode = job.trace.timings()
    assert job.params is not None
    done = Finished(
        job.fmt.id,
        list(job.prompt_ids),
        list(job.output_ids),
        job.params,
        c.stats,
        job.speculate,
        e2e,
        decode,
        job.trace.first_tokens,
    )
    try:
        ops.finished(job.route, done)
    except Exception:  # operating hooks must never fail the request they observe
        log.exception("ops hook failed on route %s", job.route.name)


async def _collect_unless_gone(request: Request, job: Job, stream: ChunkStream) -> Response:
    """A non-streamed answer; if the client hangs up first, the request is cancelled (KV freed)."""
    work = asyncio.ensure_future(collect(job, stream))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (work, gone):
            if not t.done():
                t.cancel()  # collect's finally cancels the engine request
        await asyncio.gather(work, gone, return_exceptions=True)
    if not work.cancelled() and work.exception() is None:
        return JSONResponse(work.result())
    if not work.cancelled():
        raise work.exception()  # type: ignore[misc]  # an APIError (500) for the client
    return Response(status_code=499)  # nobody is listening any more


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes", code="body_too_large")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > MAX_BODY_BYTES:
            raise APIError(413, f"the request body is larger than {MAX_BODY_BYTES} bytes", code="body_too_large")
        parts.append(part)
    return b"".join(parts)


def _route(routes: RouteTable, name: str) -> Route:
    route = routes.get(name)
    if route is None:
        raise APIError(
            404,
            f"The model '{name}' does not exist. Available models: {', '.join(routes.names)}.",
            param="model",
            code="model_not_found",
        )
    return route


def _encode(metrics: ServerMetrics, route: Route, prompt: str | Sequence[Message], raw: bool) -> list[int]:
    try:
        return route.engine.encode(prompt, raw=raw)
    except (BadRequestError, ValueError) as e:
        metrics.failure(route, "bad_request")
        raise APIError(400, str(e), param="prompt" if raw else "messages", code="invalid_value") from None


def _max_new_tokens(route: Route, asked: int | None, prompt_len: int, chat: bool) -> int:
    """What the client asked, else a default capped by what the context has left (the engine checks the sum)."""
    if asked is not None:
        return asked
    n = DEFAULT_CHAT_MAX_TOKENS if chat else DEFAULT_COMPLETION_MAX_TOKENS
    if route.context_length is not None:
        n = min(n, route.context_length - prompt_len)
    return max(1, n)


_SCHEMA_MODELS = (ChatRequest, CompletionRequest)


def _body_schema(model: type[Any]) -> dict[str, Any]:
    """Document the body in OpenAPI (the handler parses it itself, for exact 400s)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def _install_openapi(app: FastAPI) -> None:
    """Put the request models (and the models they use) into the schema's components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            comps = schema.setdefault("components", {}).setdefault("schemas", {})
            for m in _SCHEMA_MODELS:
                s = m.model_json_schema(ref_template="#/components/schemas/{model}")
                comps.update(s.pop("$defs", {}))
                comps[m.__name__] = s
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
