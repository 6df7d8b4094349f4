"""A fault-injecting proxy in front of a real vLLM (uvicorn on loopback), for the rounds' fault tests.

It forwards every request to the upstream vLLM unchanged, streams included, unless told to
fail: scoring requests (``prompt_logprobs`` on the token route) answered 400, with garbage rows,
late, or lying (every row vouching for the token it checks, clearly: drafts the server would reject
get verified); streams cut mid-way and every later request refused (vLLM killed, as the gateway sees it).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse


@dataclass
class Faults:
    scoring: str | None = None  # "400" | "garbage" | "slow" | "lie": what scoring requests get
    delay_s: float = 5.0  # "slow": how late
    dead: bool = False  # every stream is cut and every new request refused
    hits: int = 0  # scoring requests that got the fault
    streams: int = 0  # streams opened through the proxy

    def clear(self) -> None:
        self.scoring, self.dead, self.hits = None, False, 0


def _garbage(content: bytes) -> bytes:
    obj = json.loads(content)
    obj["prompt_logprobs"] = [None if r is None else {"7": {"logprob": 0.5, "rank": 1}} for r in obj["prompt_logprobs"]]
    return json.dumps(obj).encode()


def _lie(content: bytes, token_ids: list[int]) -> bytes:
    """Every row says its own prompt token is the argmax, 5 nats ahead of the runner-up."""
    obj = json.loads(content)
    obj["prompt_logprobs"] = [
        None if r is None else {str(t): {"logprob": -0.01, "rank": 1}, str(t + 1): {"logprob": -5.01, "rank": 2}}
        for r, t in zip(obj["prompt_logprobs"], token_ids, strict=True)
    ]
    return json.dumps(obj).encode()


def proxy_app(upstream: str, faults: Faults) -> FastAPI:
    app = FastAPI()
    client = httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0))

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        if faults.dead:
            return JSONResponse({"error": {"message": "upstream gone"}}, status_code=502)
        body = await request.body()
        obj = json.loads(body) if body and request.method == "POST" else {}
        scoring = path == "inference/v1/generate" and "prompt_logprobs" in (obj.get("sampling_params") or {})
        if scoring and faults.scoring == "400":
            faults.hits += 1
            return JSONResponse({"error": {"message": "injected: bad request"}}, status_code=400)
        if scoring and faults.scoring == "slow":
            faults.hits += 1
            await asyncio.sleep(faults.delay_s)
        req = client.build_request(
            request.method,
            f"{upstream}/{path}",
            content=body or None,
            headers={"content-type": "application/json"} if body else None,
        )
        r = await client.send(req, stream=True)
        if obj.get("stream"):
            faults.streams += 1

            async def chunks():  # type: ignore[no-untyped-def]
                try:
                    async for c in r.aiter_raw():
                        if faults.dead:
                            raise ConnectionResetError("injected: vLLM killed mid-stream")
                        yield c
                finally:
                    await r.aclose()

            return StreamingResponse(chunks(), status_code=r.status_code, media_type="text/event-stream")
        content = await r.aread()
        await r.aclose()
        if scoring and faults.scoring == "garbage" and r.status_code == 200:
            faults.hits += 1
            content = _garbage(content)
        if scoring and faults.scoring == "lie" and r.status_code == 200:
            faults.hits += 1
            content = _lie(content, obj["token_ids"])
        return Response(content, status_code=r.status_code, media_type=r.headers.get("content-type"))

    return app
