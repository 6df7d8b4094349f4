"""LlamaCppServerDrafter: a llama.cpp server (llama-cpp-python's or llama.cpp's own) as the draft engine.

Each round asks the server's ``POST /v1/completions`` for ``max_tokens = k``
tokens at ``temperature 0``: greedy drafts, so q is one-hot and the drafts are
verified by matching. That is exact for greedy requests *and* for sampled ones:
with our matching verifier a deterministic draft is accepted with probability
p(x) at each position and a rejection resamples from the target's residual, so
the output distribution is the target's whatever the drafter proposes (a greedy
draft only changes how often drafts are accepted, never what comes out).

The prompt is sent as text (the history decoded with its special tokens kept):
llama-cpp-python's server (0.3.x) refuses token-id prompts, and its answer is
text, re-tokenized here with the target's tokenizer. A re-tokenization that
differs from what the server generated only makes drafts worse, never the
output wrong. The server keeps the previous request's KV and reuses the
longest common prefix, so a round costs about k decode steps there.

Failure: any error, malformed answer or timeout (``timeout_s``, 250 ms by
default) gives that round no drafts (plain decoding for that round), never an
error for the request; ``failures`` counts them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import httpx

from draftgate.drafters.base import Abilities, Draft, DraftRequest
from draftgate.models.tokenizer import TextTokenizer

__all__ = ["LlamaCppServerDrafter", "DEFAULT_LLAMACPP_TIMEOUT_S"]

log = logging.getLogger("draftgate.drafters.llamacpp")
DEFAULT_LLAMACPP_TIMEOUT_S = 0.25


class LlamaCppServerDrafter:
    name = "llamacpp"
    sampled_q = False
    abilities = Abilities()  # none beyond the protocol

    def __init__(
        self,
        url: str,
        tokenizer: TextTokenizer,
        timeout_s: float = DEFAULT_LLAMACPP_TIMEOUT_S,
        client: httpx.Client | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"llama.cpp server URL must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.tokenizer = tokenizer
        # Not called ``timeout_s``: engines wrap drafters that expose that name in their own deadline,
        # and a deadline there turns drafting off for the whole request; here a slow round costs one round.
        self.request_timeout_s = timeout_s
        self._http = client or httpx.Client(timeout=timeout_s)
        self.failures = 0
        self.rounds = 0

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        return [self._one(r) if r.k > 0 and r.tokens else Draft([]) for r in requests]

    def _one(self, r: DraftRequest) -> Draft:
        self.rounds += 1
        try:
            text = self.tokenizer.decode(list(r.tokens), skip_special=False)
            resp = self._http.post(
                self.url + "/v1/completions",
                json={"prompt": text, "max_tokens": int(r.k), "temperature": 0.0, "top_k": 1, "stream": False},
                timeout=self.request_timeout_s,
            )
            resp.raise_for_status()
            completion = resp.json()["choices"][0]["text"]
            if not isinstance(completion, str):
                raise ValueError("the server's completion text is not a string")
        except Exception as e:  # timeout, connection, HTTP status, JSON shape: this round has no drafts
            self.failures += 1
            log.debug("llama.cpp drafter: no drafts this round (%s: %s)", type(e).__name__, e)
            return Draft([])
        if not completion:
            return Draft([])
        ids = self.tokenizer.encode(completion, add_special=False)[: r.k]
        return Draft([int(t) for t in ids])

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        pass

    def release(self, seq_id: int) -> None:
        pass

    def close(self) -> None:
        self._http.close()
