"""Benchmark statistics as pure functions over plain records (no I/O, no engine).

Definitions (each metric is defined here once; the report only formats them):

- A *request* is one turn of one conversation on one arm. Its timings come from
  the chunks the arm streams: ``ttft_s`` is submit -> first chunk with tokens,
  ``e2e_s`` is submit -> last chunk. A chunk may carry several tokens (a
  speculative round emits accepted + 1), so a gap of g seconds before a chunk of
  n tokens counts as n inter-token latencies of g / n each.
- A *window* is a group of prompts of one category run on one arm at one load
  level; arms take turns on the same window, so ratios are measured side by side.
- ``total_tps`` (per run) = tokens of all windows / wall time of those windows.
- ``stream_tps`` = median over requests of tokens / e2e latency.
- ``speedup`` = an arm's ``total_tps`` / the baseline's, per run, then min /
  median / max over runs: end to end, prefill included.
- ``decode_speedup`` = the same for decoding alone: per run, tokens after the first
  / time after the first token (``e2e_s - ttft_s``), summed over requests.
- ``acceptance_rate`` = accepted / drafted tokens; ``mean_accepted_length`` =
  emitted / rounds (counts the recovered or bonus token, so plain decoding is 1.0).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "RequestRecord",
    "WindowRecord",
    "percentile",
    "distribution",
    "ratio_summary",
    "itl_from_chunks",
    "group_by",
    "summarize_group",
    "speedups",
    "decode_speedups",
    "latency_ratios",
]

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
ALL = "all"  # the category that aggregates every category


@dataclass
class RequestRecord:
    """One request (one turn of one conversation) on one arm."""

    arm: str
    category: str
    prompt_id: str
    turn: int
    load: str  # "c=4" or "rate=2"
    run: int
    n_tokens: int
    ttft_s: float
    e2e_s: float
    itl_s: list[float] = field(default_factory=list)
    token_ids: list[int] | None = None  # None where the arm only returns text
    text: str = ""
    rounds: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0
    error: str | None = None


@dataclass(frozen=True)
class WindowRecord:
    """Wall time of one window of prompts on one arm (for total throughput)."""

    arm: str
    category: str
    load: str
    run: int
    wall_s: float
    n_tokens: int


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default)."""
    if not values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: Sequence[float]) -> dict[str, float]:
    """p50 / p90 / p99 / mean of a sample (NaN when empty)."""
    return {
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "mean": statistics.fmean(values) if values else math.nan,
    }


def ratio_summary(ratios: Sequence[float]) -> dict[str, float]:
    """min / median / max of per-run ratios (NaN when there are none)."""
    xs = [r for r in ratios if not math.isnan(r)]
    if not xs:
        return {"min": math.nan, "median": math.nan, "max": math.nan}
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def itl_from_chunks(times: Sequence[float], counts: Sequence[int]) -> list[float]:
    """Inter-token latencies from chunk arrival times and tokens per chunk.

    The first chunk with tokens sets the time to first token; every later chunk of
    n tokens arriving g seconds after the previous one contributes n values g / n.
    Tokens beyond the first in the *first* chunk get no latency (they arrived with it).
    """
    out: list[float] = []
    prev: float | None = None
    for t, n in zip(times, counts, strict=True):
        if n <= 0:
            continue
        if prev is not None:
            out.extend([(t - prev) / n] * n)
        prev = t
    return out


def group_by(items: Iterable[T], key: Callable[[T], K]) -> dict[K, list[T]]:
    """Items grouped by key, groups and items in first-seen order."""
    groups: dict[K, list[T]] = defaultdict(list)
    for it in items:
        groups[key(it)].append(it)
    return dict(groups)


def _total_tps_per_run(windows: Sequence[WindowRecord]) -> dict[int, float]:
    out = {}
    for run, ws in group_by(windows, lambda w: w.run).items():
        wall = sum(w.wall_s for w in ws)
        out[run] = sum(w.n_tokens for w in ws) / wall if wall > 0 else math.nan
    return out


def summarize_group(requests: Sequence[RequestRecord], windows: Sequence[WindowRecord]) -> dict[str, Any]:
    """Every metric of one arm x category x load (see the module docstring)."""
    ok = [r for r in requests if r.error is None]
    per_run = _total_tps_per_run(windows)
    drafted = sum(r.draft_tokens for r in ok)
    rounds = sum(r.rounds for r in ok)
    return {
        "requests": len(requests),
        "errors": len(requests) - len(ok),
        "tokens": sum(r.n_tokens for r in ok),
        "total_tps": statistics.median(per_run.values()) if per_run else math.nan,
        "total_tps_per_run": {str(k): v for k, v in sorted(per_run.items())},
        "stream_tps": statistics.median([r.n_tokens / r.e2e_s for r in ok if r.e2e_s > 0] or [math.nan]),
        "ttft_s": distribution([r.ttft_s for r in ok]),
        "itl_s": distribution([x for r in ok for x in r.itl_s]),
        "e2e_s": distribution([r.e2e_s for r in ok]),
        "acceptance_rate": sum(r.accepted_tokens for r in ok) / drafted if drafted else None,
        "mean_accepted_length": sum(r.emitted_tokens for r in ok) / rounds if rounds else None,
    }


def speedups(arm: Sequence[WindowRecord], baseline: Sequence[WindowRecord]) -> dict[str, float]:
    """Per-run total-throughput ratios arm / baseline, summarized as min / median / max."""
    a, b = _total_tps_per_run(arm), _total_tps_per_run(baseline)
    return ratio_summary([a[r] / b[r] for r in sorted(a) if r in b and b[r] > 0])


def decode_speedups(arm: Sequence[RequestRecord], baseline: Sequence[RequestRecord]) -> dict[str, float]:
    """Per-run decode-rate ratios arm / baseline (prefill left out), as min / median / max."""

    def per_run(rs: Sequence[RequestRecord]) -> dict[int, float]:
        out = {}
        for run, g in group_by([r for r in rs if r.error is None and r.n_tokens > 1], lambda r: r.run).items():
            seconds = sum(r.e2e_s - r.ttft_s for r in g)
            out[run] = sum(r.n_tokens - 1 for r in g) / seconds if seconds > 0 else math.nan
        return out

    a, b = per_run(arm), per_run(baseline)
    return ratio_summary([a[r] / b[r] for r in sorted(a) if r in b and b[r] > 0])


def latency_ratios(arm: Sequence[RequestRecord], baseline: Sequence[RequestRecord]) -> dict[str, float]:
    """Per-run ratios of median end-to-end latency arm / baseline, as min / median / max (< 1 is faster)."""

    def per_run(rs: Sequence[RequestRecord]) -> dict[int, float]:
        ok = [r for r in rs if r.error is None]
        return {run: percentile([r.e2e_s for r in g], 50) for run, g in group_by(ok, lambda r: r.run).items()}

    a, b = per_run(arm), per_run(baseline)
    return ratio_summary([a[r] / b[r] for r in sorted(a) if r in b and b[r] > 0])
