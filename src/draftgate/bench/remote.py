"""An external OpenAI-compatible server as an arm (vLLM, llama.cpp server, `draftgate serve`).

Kept deliberately simple: the chat is rendered with the local model's chat
template and sent as ``prompt`` to ``POST {url}/completions`` with
``stream: true``; each SSE event is one chunk. Tokens per chunk come from
``choices[0].logprobs.tokens`` when the server sends them, else count 1 per
non-empty event; a final ``usage.completion_tokens`` (requested through
``stream_options.include_usage``) replaces the total. So for servers that pack
several tokens into one event without logprobs, ITL is per event, not per token.
Outputs are text only: the lossless check compares text for these arms.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from draftgate.bench.arm_spec import ArmError, ArmSpec, Piece
from draftgate.models.tokenizer import Message, TextTokenizer
from draftgate.types import SamplingParams

__all__ = ["OpenAIArm", "parse_sse_event"]

TIMEOUT_S = 600.0


def parse_sse_event(obj: dict[str, Any]) -> Piece:
    """One decoded ``data:`` object of a /v1/completions stream to a Piece."""
    if "error" in obj:
        err = obj["error"]
        raise ArmError(f"server error: {err.get('message', err) if isinstance(err, dict) else err}")
    choices = obj.get("choices") or []
    text = (choices[0].get("text") or "") if choices else ""
    lp = (choices[0].get("logprobs") or {}) if choices else {}
    toks = lp.get("tokens") if isinstance(lp, dict) else None
    n = len(toks) if toks else (1 if text else 0)
    usage = obj.get("usage") or {}
    total = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return Piece(n, text, total_tokens=int(total) if isinstance(total, int) else None)


class OpenAIArm:
    def __init__(self, spec: ArmSpec, tokenizer: TextTokenizer, transport: Any = None) -> None:
        assert spec.url is not None
        self.spec = spec
        self._transport = transport  # an httpx transport (tests pass httpx.MockTransport)
        self._tok = tokenizer
        self._client: Any = None  # an httpx.AsyncClient, made inside the runner's event loop
        self._model = spec.served_model

    def _http(self) -> Any:
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(timeout=TIMEOUT_S, transport=self._transport)
        return self._client

    async def _served_model(self) -> str:
        if self._model is None:
            try:
                r = await self._http().get(f"{self.spec.url}/models")
                data = (r.json().get("data") or []) if r.status_code == 200 else []
            except Exception as e:
                raise ArmError(f"arm {self.spec.name}: cannot reach {self.spec.url}: {e}") from e
            self._model = str(data[0]["id"]) if data and "id" in data[0] else "default"
        return self._model

    async def stream(self, messages: list[Message], params: SamplingParams) -> AsyncIterator[Piece]:
        body: dict[str, Any] = {
            "model": await self._served_model(),
            "prompt": self._tok.apply_chat_template(messages),
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if params.top_k:
            body["top_k"] = params.top_k
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = list(params.stop)
        if params.ignore_eos:
            body["ignore_eos"] = True  # vLLM's extension; other servers may ignore it
        try:
            async with self._http().stream("POST", f"{self.spec.url}/completions", json=body) as resp:
                if resp.status_code != 200:
                    detail = (await resp.aread()).decode(errors="replace")[:300]
                    raise ArmError(f"arm {self.spec.name}: HTTP {resp.status_code}: {detail}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:") :].strip()
                    if data == "[DONE]":
                        return
                    yield parse_sse_event(json.loads(data))
        except ArmError:
            raise
        except Exception as e:
            raise ArmError(f"arm {self.spec.name}: {type(e).__name__}: {e}") from e

    def new_run(self) -> None:
        pass  # a server we do not own: its caches are its own

    async def aclose(self) -> None:
        """Close the HTTP client inside the loop that opened it (the runner calls this)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def close(self) -> None:
        self._client = None
