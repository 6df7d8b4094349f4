"""OpenAI response bodies and stream chunks, for chat (``chat.completion``) and text (``text_completion``).

Our extension on every full response and on the final stream chunk:
``speculative`` = {drafter, draft_tokens, accepted_tokens, acceptance_rate,
mean_accepted_length, approximate, target_decoded, fallback_rounds} for that request (mean
accepted length counts the bonus or recovered token, so plain decoding reports 1.0;
``approximate`` is true when the route verified this request by an approximation it allows:
sampling on an openai+http target; ``target_decoded`` is true when a request ran entirely
on the target server's own decoding, relayed by a vllm+http round route; ``fallback_rounds``
counts rounds whose drafts the target could not score, decoded plainly instead).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from draftgate.types import SpecStats

__all__ = ["Format", "speculative_json", "usage_json", "sse", "SSE_DONE"]

SSE_DONE = "data: [DONE]\n\n"


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


def speculative_json(stats: SpecStats | None, drafter: str) -> dict[str, Any]:
    s = stats or SpecStats(drafter=drafter)
    return {
        "drafter": s.drafter,
        "draft_tokens": s.draft_tokens,
        "accepted_tokens": s.accepted_tokens,
        "acceptance_rate": round(s.acceptance_rate, 4),
        "mean_accepted_length": round(s.mean_accepted_length, 4),
        "approximate": s.approximate,
        "target_decoded": s.target_decoded,
        "fallback_rounds": s.fallback_rounds,
    }


def usage_json(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass
class Format:
    """Renders one request's bodies; ``chat`` selects the chat shapes, else text completions."""

    chat: bool
    model: str
    include_usage: bool = False
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex

    # ---------------------------------------------------------------- full body

    def response(
        self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int, spec: dict[str, Any]
    ) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {
            **self._head(stream=False),
            "choices": [choice],
            "usage": usage_json(prompt_tokens, completion_tokens),
            "speculative": spec,
        }

    # ------------------------------------------------------------------- stream

    def first_chunk(self) -> str | None:
        """Chat streams open with the assistant role (as OpenAI's do); text streams have none."""
        return self._chunk({"role": "assistant", "content": ""}) if self.chat else None

    def delta_chunk(self, text: str) -> str:
        return self._chunk({"content": text} if self.chat else text)

    def final_chunk(self, finish_reason: str, spec: dict[str, Any]) -> str:
        body = self._chunk_body({} if self.chat else "", finish_reason)
        body["speculative"] = spec
        return sse(body)

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> str:
        return sse({**self._head(stream=True), "choices": [], "usage": usage_json(prompt_tokens, completion_tokens)})

    # ---------------------------------------------------------------- internals

    def _head(self, stream: bool) -> dict[str, Any]:
        if self.chat:
            obj = "chat.completion.chunk" if stream else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "system_fingerprint": None}

    def _chunk_body(self, delta: dict[str, str] | str, finish_reason: str | None) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish_reason}
        body = {**self._head(stream=True), "choices": [choice]}
        if self.include_usage:
            body["usage"] = None  # OpenAI: null on every chunk but the last
        return body

    def _chunk(self, delta: dict[str, str] | str) -> str:
        return sse(self._chunk_body(delta, None))
