"""Measurements of a running vLLM for the comparison: its prefix-cache and speculation counters, what a round costs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import httpx

__all__ = ["counters", "prefix_cache", "round_cost", "spec_decode"]


def counters(url: str, names: Sequence[str]) -> dict[str, float]:
    """vLLM's counters so far (summed over engines and labels; 0 for one it does not export)."""
    got = dict.fromkeys(names, 0.0)
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        name = line.split("{", 1)[0]
        if name in got:
            got[name] += float(line.rsplit(" ", 1)[1])
    return got


def prefix_cache(url: str) -> tuple[float, float]:
    """vLLM's prefix-cache (hits, queries) so far, in prompt tokens."""
    c = counters(url, ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"))
    return c["vllm:prefix_cache_hits_total"], c["vllm:prefix_cache_queries_total"]


SPEC = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


def spec_decode(url: str) -> tuple[float, float, float]:
    """vLLM's speculative-decoding (drafts, draft tokens, accepted tokens) so far: any method's."""
    c = counters(url, SPEC)
    return c[SPEC[0]], c[SPEC[1]], c[SPEC[2]]


def round_cost(url: str, prompt_ids: Sequence[int], k: int = 16, reps: int = 5) -> dict[str, float]:
    """What the gateway's requests cost on vLLM's token route, in ms (medians): a plain token in a
    stream, a ``max_tokens: 1`` request, and a scoring request over the prompt + k drafts."""
    gen = f"{url}/inference/v1/generate"
    sp: dict[str, Any] = {"temperature": 0.0, "detokenize": False, "ignore_eos": True}
    with httpx.Client(timeout=120) as c:
        c.post(gen, json={"token_ids": list(prompt_ids), "sampling_params": {**sp, "max_tokens": 1}})  # cache it
        arrivals: list[float] = []
        with c.stream(
            "POST",
            gen,
            json={"token_ids": list(prompt_ids), "stream": True, "sampling_params": {**sp, "max_tokens": 48}},
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    arrivals.append(time.perf_counter())
        one, score = [], []
        for i in range(reps):
            ids = [*prompt_ids, 300 + i]
            t0 = time.perf_counter()
            c.post(gen, json={"token_ids": ids, "sampling_params": {**sp, "max_tokens": 1}})
            t1 = time.perf_counter()
            c.post(
                gen,
                json={
                    "token_ids": [*ids, *range(400, 400 + k)],
                    "sampling_params": {
                        **sp,
                        "max_tokens": 1,
                        "prompt_logprobs": 1,
                        "skip_reading_prefix_cache": False,
                    },
                },
            )
            one.append(t1 - t0)
            score.append(time.perf_counter() - t1)
    gaps = [b - a for a, b in zip(arrivals[1:], arrivals[2:], strict=False)]
    return {
        "token_ms": 1e3 * statistics.median(gaps),
        "request_ms": 1e3 * statistics.median(one),
        "score_ms": 1e3 * statistics.median(score),
        "prompt_tokens": len(prompt_ids),
        "k": k,
    }
