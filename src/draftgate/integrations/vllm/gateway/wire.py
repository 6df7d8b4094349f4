"""vLLM's token-in/token-out route (``POST /inference/v1/generate``, server flag ``--enable-scale-out``).

The wire under the gateway's vLLM round target (``target.VllmRoundTarget``): token ids in,
token ids out, no text anywhere. Two calls:

* ``score``: one request over ``history + drafts`` with ``max_tokens: 1``, ``prompt_logprobs: 2``,
  ``logprobs: 2`` and ``skip_reading_prefix_cache: false`` (the prefix cache is read, so only the
  rows past the cached prefix are computed). Row m of ``prompt_logprobs`` is the distribution that
  predicts prompt token m: the token's own log-probability and rank, and the top two. Rows inside
  the cached prefix are not computed: vLLM reports them zero-filled (with DraftGate's plugin, or a
  vLLM that has the fix) and, with ``--enable-prompt-tokens-details``, says how many tokens it
  found cached. ``read_row`` accepts a row only when it is provably computed and well formed;
  ``margin`` is how far its top-1 leads the runner-up (the round trusts a row's argmax only past
  a margin: a scoring pass and a decode step round differently).
* ``stream``: plain decoding from a history, streamed token by token (``VllmStream``); closing it
  disconnects, and vLLM aborts the request.

``cache_salt`` (the request's own, where the client sent one) keeps a request's KV apart from
other tenants' in vLLM's prefix cache.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from draftgate.errors import DraftGateError
from draftgate.types import SamplingParams

__all__ = [
    "GENERATE",
    "VllmWire",
    "VllmStream",
    "Scored",
    "RowError",
    "GarbageRow",
    "WireError",
    "StreamError",
    "error_message",
    "read_row",
    "top1",
    "margin",
]

GENERATE = "/inference/v1/generate"


class WireError(DraftGateError, RuntimeError):
    """vLLM refused or failed a request (HTTP status, an error in the stream, a malformed body)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class StreamError(WireError):
    """A plain stream failed, stalled or ended early: the sequence cannot go on (no fallback is left)."""


class RowError(WireError):
    """A prompt log-probability row the round needs was not computed (it lies in the cached prefix)."""


class GarbageRow(RowError):
    """A row that claims to be computed but is not well formed: the round cannot trust it."""


@dataclass(frozen=True)
class Scored:
    """One scoring request's answer."""

    rows: list[dict[int, tuple[float, int]] | None]  # per prompt position: token -> (logprob, rank)
    token: int  # the token vLLM chose after the whole prompt (greedy: its argmax)
    cached: int | None  # prompt tokens vLLM found in its prefix cache (None: not reported)
    token_margin: float = math.inf  # how far ``token`` led the runner-up in its distribution (inf: not reported)


def read_row(s: Scored, token_ids: Sequence[int], m: int) -> dict[int, tuple[float, int]]:
    """Row m (the distribution that predicts token_ids[m]) if it is computed and well formed, else RowError.

    Computed: past the cached prefix when vLLM reports it (rows ``cached + 1`` on), and never the
    zero-fill a cached row gets ({0: (0.0, rank)} for a token other than 0; for token 0 that shape
    is ambiguous and is refused too): else RowError. Well formed: it holds token_ids[m] with a
    rank, exactly one rank-1 entry, finite log-probabilities <= 0, the own token no more likely
    than the top-1: else GarbageRow. (vLLM ranks the top entries by position, so a tie at the top
    still shows one rank-1 entry: ``margin`` is what tells a tie.)
    """
    if s.cached is not None and m < s.cached + 1:
        raise RowError(f"row {m} lies in the cached prefix ({s.cached} tokens): not computed")
    if not 0 <= m < len(s.rows) or s.rows[m] is None:
        raise RowError(f"row {m} missing from the answer ({len(s.rows)} rows)")
    row = s.rows[m]
    assert row is not None
    if set(row) == {0} and row[0][0] == 0.0:  # zeroed buffers: token 0 at log-probability 0 (its rank by k)
        raise RowError(f"row {m} is zero-filled: vLLM did not compute it (cached)")
    own = row.get(int(token_ids[m]))
    if own is None or own[1] < 1:
        raise GarbageRow(f"row {m} lacks its own token {token_ids[m]}")
    tops = [t for t, (_, rank) in row.items() if rank == 1]
    if len(tops) != 1 or any(not (math.isfinite(lp) and lp <= 0.0) for lp, _ in row.values()):
        raise GarbageRow(f"row {m} is not well formed ({len(tops)} rank-1 entries)")
    if own[0] > row[tops[0]][0]:
        raise GarbageRow(f"row {m}: its own token is more likely than its top-1")
    return row


def top1(row: dict[int, tuple[float, int]]) -> int:
    """The row's rank-1 token (read_row checked there is exactly one)."""
    return next(t for t, (_, rank) in row.items() if rank == 1)


def margin(row: dict[int, tuple[float, int]]) -> float:
    """How far the row's top-1 leads the best other token it lists (0 for a tie; inf: none listed).

    A scoring request asks for the top two, so the runner-up is listed unless it merged with the own
    token (listed anyway) or the vocabulary has one token."""
    lps = sorted((lp for lp, _ in row.values()), reverse=True)
    return lps[0] - lps[1] if len(lps) > 1 else math.inf


def _token_margin(choice: dict[str, Any]) -> float:
    """The margin of the token a scoring request generated, from its ``logprobs`` (inf: not reported)."""
    content = ((choice.get("logprobs") or {}).get("content")) or []
    if not content:
        return math.inf
    tops = {int(c["token_id"]): float(c["logprob"]) for c in content[0].get("top_logprobs") or []}
    lps = sorted(tops.values(), reverse=True)
    return lps[0] - lps[1] if len(lps) > 1 else math.inf


def _parse_rows(raw: object, first: int) -> list[dict[int, tuple[float, int]] | None]:
    """The rows from ``first`` on, parsed (those before it: None, never read)."""
    if not isinstance(raw, list):
        raise WireError("the answer has no prompt_logprobs list")
    rows: list[dict[int, tuple[float, int]] | None] = [None] * min(first, len(raw))
    for r in raw[first:]:
        if r is None:
            rows.append(None)
            continue
        rows.append(
            {int(t): (float(v["logprob"]), int(v["rank"]) if v.get("rank") is not None else 0) for t, v in r.items()}
        )
    return rows


def error_message(text: str) -> str:
    """The message of a vLLM error body (its ``error.message``), else the body's start."""
    try:
        obj = json.loads(text)
    except ValueError:
        return text[:300]
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    return str(err.get("message", err) if isinstance(err, dict) else err)[:300]


def sampling_body(params: SamplingParams, max_tokens: int) -> dict[str, Any]:
    """vLLM's own sampling parameters for plain decoding of a request (the engine owns stop rules)."""
    sp: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "ignore_eos": True,
        "detokenize": False,
        "skip_reading_prefix_cache": False,
    }
    if params.top_k:
        sp["top_k"] = params.top_k
    if params.seed is not None and not params.greedy:
        sp["seed"] = params.seed
    return sp


class VllmStream:
    """One plain-decoding request streaming from vLLM, read by its own thread into ``tokens``.

    ``base`` is the history length the stream started from: ``tokens[i]`` follows
    ``history[:base] + tokens[:i]``. ``close`` disconnects, and vLLM aborts the request.
    """

    def __init__(self, client: httpx.Client, url: str, body: dict[str, Any], base: int) -> None:
        self.base = base
        self.tokens: list[int] = []
        self.arrivals: list[float] = []  # perf_counter() at each token's arrival
        self.started = time.perf_counter()
        self.finished = False  # vLLM ended it (max_tokens), or it failed, or it was closed
        self.error: str | None = None
        self._cv = threading.Condition()
        self._cm = client.stream("POST", url, json=body)
        self._resp: httpx.Response | None = None
        threading.Thread(target=self._read, daemon=True, name="vllm-stream").start()

    def _read(self) -> None:
        """Open the request and read it (here, so that opening never blocks the engine's loop)."""
        try:
            resp = self._resp = self._cm.__enter__()
            if resp.status_code != 200:
                resp.read()
                raise WireError(f"vLLM answered HTTP {resp.status_code}: {error_message(resp.text)}", resp.status_code)
            for line in resp.iter_lines():
                if self.finished:
                    return
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[len("data: ") :])
                if "error" in obj:
                    raise WireError(f"vLLM failed the request: {obj['error']}")
                choice = obj["choices"][0]
                ids = [int(t) for t in choice.get("token_ids") or []]
                now = time.perf_counter()
                with self._cv:
                    self.tokens.extend(ids)
                    self.arrivals.extend([now] * len(ids))
                    self._cv.notify_all()
        except Exception as e:  # noqa: BLE001 -- any failure ends the stream; the waiter reports it
            with self._cv:
                if not self.finished:
                    self.error = f"{type(e).__name__}: {e}"
        finally:
            with self._cv:
                self.finished = True
                self._cv.notify_all()
            try:
                self._cm.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 -- closing a broken connection
                pass

    def wait(self, count: int, timeout_s: float) -> list[int]:
        """Tokens once it has ``count`` (or it ended); WireError if it failed, or timed out with fewer."""
        with self._cv:
            self._cv.wait_for(lambda: len(self.tokens) >= count or self.finished, timeout=timeout_s)
            if len(self.tokens) >= count:
                return list(self.tokens)
            if self.error is not None:
                raise StreamError(f"vLLM's stream failed: {self.error}")
            if not self.finished:
                raise StreamError(f"vLLM sent no token for {timeout_s:.0f} s")
            return list(self.tokens)

    def snapshot(self) -> list[int]:
        with self._cv:
            return list(self.tokens)

    def close(self) -> None:
        with self._cv:
            self.finished = True
            self._cv.notify_all()
        resp = self._resp
        if resp is not None:
            try:
                resp.close()  # disconnects: vLLM aborts the request
            except Exception:  # noqa: BLE001 -- closing a broken connection
                pass


class VllmWire:
    """Requests to one vLLM server's token route (thread-safe: httpx.Client is)."""

    def __init__(self, url: str, client: httpx.Client, model: str, timeout_s: float) -> None:
        self.url = url.rstrip("/") + GENERATE
        self.client = client
        self.model = model
        self.timeout_s = timeout_s

    def score(
        self, token_ids: Sequence[int], salt: str | None, from_row: int = 0, timeout_s: float | None = None
    ) -> Scored:
        """One scoring request over token_ids (the prefix cache read; rows past it computed).

        Only rows from ``from_row`` on are parsed: vLLM answers one per prompt token, the round
        reads those of its drafts. ``timeout_s``: this request's (default: the wire's)."""
        body: dict[str, Any] = {
            "model": self.model,
            "token_ids": list(token_ids),
            "sampling_params": {
                "max_tokens": 1,
                "temperature": 0.0,
                "prompt_logprobs": 2,
                "logprobs": 2,
                "detokenize": False,
                "skip_reading_prefix_cache": False,
                "ignore_eos": True,
            },
        }
        if salt is not None:
            body["cache_salt"] = salt
        r = self.client.post(self.url, json=body, timeout=timeout_s or self.timeout_s)
        if r.status_code != 200:
            raise WireError(f"vLLM answered HTTP {r.status_code}: {error_message(r.text)}", r.status_code)
        try:
            obj = r.json()
            choice = obj["choices"][0]
            (tok,) = choice["token_ids"]
            details = (obj.get("usage") or {}).get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens")
            rows = _parse_rows(obj.get("prompt_logprobs"), from_row)
            return Scored(rows, int(tok), int(cached) if cached is not None else None, _token_margin(choice))
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
            raise WireError(f"vLLM's answer is malformed: {type(e).__name__}: {e}") from None

    def stream(self, token_ids: Sequence[int], params: SamplingParams, max_tokens: int, salt: str | None) -> VllmStream:
        """Plain decoding from token_ids (vLLM's own greedy or seeded sampling), streamed."""
        body: dict[str, Any] = {
            "model": self.model,
            "token_ids": list(token_ids),
            "stream": True,
            "sampling_params": sampling_body(params, max_tokens),
        }
        if salt is not None:
            body["cache_salt"] = salt
        return VllmStream(self.client, self.url, body, len(token_ids))
