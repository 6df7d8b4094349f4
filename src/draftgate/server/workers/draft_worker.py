"""`draftgate serve-draft`: an HTTP draft worker (the seeds' draft tier, with exact q).

``POST /v1/propose`` takes ``{tokens, num_tokens, temperature, top_k, top_p, seed}``
and returns ``{tokens, logprobs, q}``:

* ``q[i] = {ids, probs}`` is the distribution draft token i was drawn from:
  the draft model's distribution after the request's temperature/top-k/top-p
  (the same transforms the target applies to p), cut to its ``q_top_n`` most
  likely ids and renormalized. The token is sampled from exactly that sparse
  q, so the target's rejection sampling against it is exact (the lossless rule); the
  cut only lowers acceptance, never correctness. Greedy requests get one-hot
  rows (the argmax), as do deterministic drafters (n-gram). The draw comes from
  the request's seed: the same seeded request gets the same drafts.
* ``logprobs[i] = log q[i](tokens[i])`` under that same sparse q.

Session form: with ``session_id`` the worker keeps the history, and ``tokens``
holds only what follows position ``offset`` of it (``offset`` defaults to the
length the worker holds; 0 restarts the session). An offset past the held
history answers 409 and the client resends from 0. ``DELETE
/v1/sessions/{id}`` drops a session (also evicted least-recently-used beyond
``max_sessions``).

The worker wraps any ``Drafter`` (the same classes the engine drafts with: a
``ModelDrafter`` with ``q_top_n``, whose sampled drafts carry exactly the sparse
q they were drawn from, or the n-gram drafter); it draws no random numbers of its
own. Requests are served one at a time (the drafter owns one model); the worker
never sees the target.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from draftgate.drafters.base import Draft, Drafter, DraftRequest, SparseQ
from draftgate.types import SamplingParams

__all__ = ["DraftService", "ProposeRequest", "ProposeResponse", "create_draft_app"]

MAX_PROPOSE_TOKENS = 32


# --------------------------------------------------------------------- wire models


class ProposeRequest(BaseModel):
    tokens: list[int] = Field(default_factory=list, description="the history, or its new part (session form)")
    num_tokens: int = Field(4, ge=0, le=MAX_PROPOSE_TOKENS)
    temperature: float = Field(0.0, ge=0.0, le=100.0)
    top_k: int = Field(0, ge=0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0)
    session_id: str | None = Field(None, min_length=1, max_length=128)
    offset: int | None = Field(None, ge=0, description="position of tokens[0] in the session's history")


class SparseRowJSON(BaseModel):
    ids: list[int]
    probs: list[float]


class ProposeResponse(BaseModel):
    tokens: list[int]
    logprobs: list[float]
    q: list[SparseRowJSON]
    history_len: int  # tokens the worker now holds for the session (or was sent)


# ------------------------------------------------------------------------ the service


@dataclass
class _Session:
    seq_id: int
    history: list[int]


class SessionConflict(Exception):
    """The request's offset is past what the worker holds for the session."""


class DraftService:
    """Sessions (LRU-bounded) and stateless calls over one Drafter; one request at a time."""

    def __init__(self, drafter: Drafter, max_sessions: int = 1024, vocab_size: int | None = None) -> None:
        self.drafter = drafter
        self.max_sessions = max_sessions
        self.vocab_size = vocab_size
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def propose(self, req: ProposeRequest) -> ProposeResponse:
        V = self.vocab_size
        if V is not None and any(not 0 <= t < V for t in req.tokens):
            raise ValueError(f"token ids must be in [0, {V})")
        if any(t < 0 for t in req.tokens):
            raise ValueError("token ids must be >= 0")
        params = SamplingParams(
            temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, seed=req.seed, max_new_tokens=1
        ).validate()
        with self._lock:
            if req.session_id is None:
                return self._stateless(req, params)
            s = self._session(req)
            if not s.history:
                raise ValueError("the session's history is empty: send tokens")
            return _response(self._draft(s.seq_id, s.history, req.num_tokens, params), len(s.history))

    def _draft(self, seq_id: int, history: list[int], k: int, params: SamplingParams) -> Draft:
        if not k:
            return Draft([])
        try:
            (d,) = self.drafter.propose([DraftRequest(seq_id, history, k, params)])
        except BaseException:
            self.drafter.release(seq_id)  # its state is unknown now: start again next time
            raise
        return d

    def _stateless(self, req: ProposeRequest, params: SamplingParams) -> ProposeResponse:
        if not req.tokens:
            raise ValueError("tokens must not be empty")
        seq_id = next(self._ids)
        try:
            d = self._draft(seq_id, list(req.tokens), req.num_tokens, params)
        finally:
            self.drafter.release(seq_id)
        return _response(d, len(req.tokens))

    def _session(self, req: ProposeRequest) -> _Session:
        assert req.session_id is not None
        s = self._sessions.get(req.session_id)
        if s is None:
            if req.offset:
                raise SessionConflict(f"unknown session {req.session_id!r}: resend its history from offset 0")
            s = self._sessions[req.session_id] = _Session(next(self._ids), [])
            while len(self._sessions) > self.max_sessions:
                _, old = self._sessions.popitem(last=False)
                self.drafter.release(old.seq_id)
        self._sessions.move_to_end(req.session_id)
        offset = len(s.history) if req.offset is None else req.offset
        if offset > len(s.history):
            raise SessionConflict(f"offset {offset} is past the {len(s.history)} tokens held: resend from 0")
        s.history[offset:] = req.tokens
        return s

    def delete(self, session_id: str) -> bool:
        with self._lock:
            s = self._sessions.pop(session_id, None)
            if s is not None:
                self.drafter.release(s.seq_id)
            return s is not None

    @property
    def num_sessions(self) -> int:
        return len(self._sessions)


def _rows(d: Draft) -> list[tuple[list[int], list[float]]]:
    """Each draft token's q as (ids, probs): one-hot for deterministic drafts, the nonzero entries otherwise."""
    if d.q is None:
        return [([t], [1.0]) for t in d.token_ids]
    if isinstance(d.q, SparseQ):
        ids, probs = d.q.ids, d.q.probs.float()
    else:
        probs, ids = d.q.float(), torch.arange(d.q.shape[1]).expand_as(d.q)
    out = []
    for i in range(len(d.token_ids)):
        keep = probs[i] > 0
        out.append((ids[i][keep].tolist(), probs[i][keep].tolist()))
    return out


def _response(d: Draft, history_len: int) -> ProposeResponse:
    rows = _rows(d)
    logprobs = [math.log(probs[ids.index(t)]) for t, (ids, probs) in zip(d.token_ids, rows, strict=True)]
    q = [SparseRowJSON(ids=i, probs=p) for i, p in rows]
    return ProposeResponse(tokens=list(d.token_ids), logprobs=logprobs, q=q, history_len=history_len)


def create_draft_app(service: DraftService) -> FastAPI:
    """The HTTP edge: validate, call the service, answer JSON (errors as {"error": {...}})."""
    app = FastAPI(title="draftgate draft worker", docs_url=None, redoc_url=None)

    @app.post("/v1/propose", response_model=ProposeResponse)
    def propose(req: ProposeRequest) -> ProposeResponse:
        try:
            return service.propose(req)
        except SessionConflict as e:
            raise HTTPException(409, str(e)) from None
        except ValueError as e:
            raise HTTPException(400, str(e)) from None
        except Exception as e:  # the draft model failed: the client falls back to plain decoding
            raise HTTPException(503, f"draft failure: {type(e).__name__}: {e}") from None

    @app.delete("/v1/sessions/{session_id}")
    def delete(session_id: str) -> dict[str, bool]:
        return {"deleted": service.delete(session_id)}

    @app.get("/health")
    def health() -> dict[str, object]:
        return {"status": "ok", "sessions": service.num_sessions}

    return app
