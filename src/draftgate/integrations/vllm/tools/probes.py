"""Measurements of a running vLLM for the comparison: its prefix-cache counters, what a round costs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import httpx

__all__ = ["prefix_cache", "round_cost"]


def prefix_cache(url: str) -> tuple[float, float]:
    """vLLM's prefix-cache (hits, queries) so far, in prompt tokens."""
    got = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"):
            if line.startswith(name + "{"):
                got[name] = got.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return got.get("vllm:prefix_cache_hits_total", 0.0), got.get("vllm:prefix_cache_queries_total", 0.0)


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
