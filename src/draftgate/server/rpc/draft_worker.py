"""`draftgate serve-draft`: an HTTP draft worker (the seeds' draft tier, with exact q).

``POST /v1/propose`` takes ``{tokens, num_tokens, temperature, top_k, top_p, seed}``
and returns ``{tokens, logprobs, q}``:

* ``q[i] = {ids, probs}`` is the distribution draft token i was drawn from:
  the draft model's distribution after the request's temperature/top-k/top-p
  (the same transforms the target applies to p), cut to its ``q_top_n`` most
  likely ids and renormalized. The token is sampled from exactly that sparse
  q, so the target's rejection sampling against it is exact (DESIGN 5.1); the
  cut only lowers acceptance, never correctness. Greedy requests get one-hot
  rows (the argmax), as do deterministic proposers (n-gram).
* ``logprobs[i] = log q[i](tokens[i])`` under that same sparse q.

Session form: with ``session_id`` the worker keeps the history, and ``tokens``
holds only what follows position ``offset`` of it (``offset`` defaults to the
length the worker holds; 0 restarts the session). An offset past the held
history answers 409 and the client resends from 0. ``DELETE
/v1/sessions/{id}`` drops a session (also evicted least-recently-used beyond
``max_sessions``).

Requests are served one at a time (the proposer owns one model); the worker
never sees the target.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from draftgate.drafters.base import DraftRequest
from draftgate.drafters.model import common_prefix
from draftgate.drafters.ngram import NgramDrafter
from draftgate.models.runner import ForwardItem, ModelRunner
from draftgate.sampling import logits_to_probs, sample_from_probs
from draftgate.types import SamplingParams

__all__ = [
    "DraftService",
    "ModelProposer",
    "NgramProposer",
    "Proposal",
    "Proposer",
    "ProposeRequest",
    "ProposeResponse",
    "create_draft_app",
]

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


# ------------------------------------------------------------------------ proposers


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]
    q_ids: list[list[int]]  # per token: the support of its sparse q
    q_probs: list[list[float]]  # per token: q over that support (sums to 1)


class Proposer(Protocol):
    def propose(
        self, seq_id: int, history: Sequence[int], n: int, params: SamplingParams, gen: torch.Generator
    ) -> Proposal: ...

    def release(self, seq_id: int) -> None: ...


class ModelProposer:
    """A Llama-family draft model on our runner; keeps KV per session, rolled back by common prefix."""

    def __init__(self, runner: ModelRunner, q_top_n: int = 64) -> None:
        if q_top_n < 1:
            raise ValueError(f"q_top_n must be >= 1, got {q_top_n}")
        self.runner = runner
        self.q_top_n = q_top_n
        self._fed: dict[int, list[int]] = {}  # tokens whose KV the runner holds, per sequence

    def _next_logits(self, seq_id: int, history: list[int]) -> torch.Tensor:
        """Bring the sequence's KV to history[:-1] + feed the rest; logits [V] after history."""
        fed = self._fed.get(seq_id)
        if fed is None:
            fed = history[: self.runner.add_sequence(seq_id, history)]
        n = min(common_prefix(fed, history), len(history) - 1)  # feed >= 1 token for logits
        self._fed.pop(seq_id, None)  # unknown until the forwards succeed
        self.runner.truncate(seq_id, n)
        for s in range(n, len(history), 512):
            logits = self.runner.forward([ForwardItem(seq_id, history[s : s + 512], 1)])[0][-1]
        self._fed[seq_id] = list(history)
        return logits

    def propose(
        self, seq_id: int, history: Sequence[int], n: int, params: SamplingParams, gen: torch.Generator
    ) -> Proposal:
        hist = list(history)
        try:
            logits = self._next_logits(seq_id, hist)
            out = Proposal([], [], [])
            for i in range(n):
                ids, probs = self._sparse_q(logits, params)  # [M], [M]
                u = torch.rand(1, generator=gen, dtype=torch.float64)
                t = int(ids[sample_from_probs(probs[None], u)[0]])  # drawn from exactly this sparse q
                out.tokens.append(t)
                out.q_ids.append(ids.tolist())
                out.q_probs.append(probs.tolist())
                if i < n - 1:
                    logits = self.runner.forward([ForwardItem(seq_id, [t], 1)])[0][-1]
                    self._fed[seq_id].append(t)
            return out
        except BaseException:
            self.release(seq_id)  # its KV state is unknown now: start again next time
            raise

    def _sparse_q(self, logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """q after the request's transforms, cut to its top-n nonzero ids, renormalized."""
        q = logits_to_probs(logits[None], params.temperature, params.top_k, params.top_p)[0]  # [V]
        probs, ids = q.topk(min(self.q_top_n, q.shape[0]))  # [M], best first
        keep = probs > 0
        probs, ids = probs[keep], ids[keep]
        return ids, probs / probs.sum()

    def release(self, seq_id: int) -> None:
        if self._fed.pop(seq_id, None) is not None or self.runner.kv.has(seq_id):
            self.runner.free(seq_id)


class NgramProposer:
    """Prompt lookup (no model): deterministic, so every q row is one-hot."""

    def __init__(self, max_n: int = 4) -> None:
        self._ngram = NgramDrafter(max_n=max_n)

    def propose(
        self, seq_id: int, history: Sequence[int], n: int, params: SamplingParams, gen: torch.Generator
    ) -> Proposal:
        (d,) = self._ngram.propose([DraftRequest(seq_id, history, n, params)])
        return Proposal(d.token_ids, [[t] for t in d.token_ids], [[1.0] for _ in d.token_ids])

    def release(self, seq_id: int) -> None:
        self._ngram.release(seq_id)


# ------------------------------------------------------------------------ the service


def _derive_seed(seed: int | None, salt: str) -> int:
    """The draft's own stream: never the target's (a seeded request seeds both ends)."""
    if seed is None:
        return int(torch.randint(0, 2**62, (1,)))
    return int.from_bytes(hashlib.sha256(f"draftgate-draft:{seed}:{salt}".encode()).digest()[:8], "little") >> 2


@dataclass
class _Session:
    seq_id: int
    history: list[int]
    gen: torch.Generator


class SessionConflict(Exception):
    """The request's offset is past what the worker holds for the session."""


class DraftService:
    """Sessions (LRU-bounded) and stateless calls over one Proposer; one request at a time."""

    def __init__(self, proposer: Proposer, max_sessions: int = 1024, vocab_size: int | None = None) -> None:
        self.proposer = proposer
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
            p = self.proposer.propose(s.seq_id, s.history, req.num_tokens, params, s.gen) if req.num_tokens else None
            return _response(p, len(s.history))

    def _stateless(self, req: ProposeRequest, params: SamplingParams) -> ProposeResponse:
        if not req.tokens:
            raise ValueError("tokens must not be empty")
        seq_id = next(self._ids)
        gen = torch.Generator().manual_seed(_derive_seed(req.seed, str(len(req.tokens))))
        try:
            p = self.proposer.propose(seq_id, req.tokens, req.num_tokens, params, gen) if req.num_tokens else None
        finally:
            self.proposer.release(seq_id)
        return _response(p, len(req.tokens))

    def _session(self, req: ProposeRequest) -> _Session:
        assert req.session_id is not None
        s = self._sessions.get(req.session_id)
        if s is None:
            if req.offset:
                raise SessionConflict(f"unknown session {req.session_id!r}: resend its history from offset 0")
            gen = torch.Generator().manual_seed(_derive_seed(req.seed, req.session_id))
            s = self._sessions[req.session_id] = _Session(next(self._ids), [], gen)
            while len(self._sessions) > self.max_sessions:
                _, old = self._sessions.popitem(last=False)
                self.proposer.release(old.seq_id)
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
                self.proposer.release(s.seq_id)
            return s is not None

    @property
    def num_sessions(self) -> int:
        return len(self._sessions)


def _response(p: Proposal | None, history_len: int) -> ProposeResponse:
    if p is None:
        return ProposeResponse(tokens=[], logprobs=[], q=[], history_len=history_len)
    logprobs = [math.log(probs[ids.index(t)]) for t, ids, probs in zip(p.tokens, p.q_ids, p.q_probs, strict=True)]
    rows = [SparseRowJSON(ids=i, probs=q) for i, q in zip(p.q_ids, p.q_probs, strict=True)]
    return ProposeResponse(tokens=p.tokens, logprobs=logprobs, q=rows, history_len=history_len)


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
