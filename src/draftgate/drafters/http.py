"""HttpDrafter: a Drafter backed by a `draftgate serve-draft` worker over HTTP.

Each sequence gets a session on the worker, so a call sends only the tokens past
what the worker already holds (``offset`` says where they go: the end of the
longest common prefix with the last history sent, so a history that went back,
or a call made on a guessed continuation, costs no resend; a 409 from the worker
means it lost the session, and the full history is resent once). A call that
failed leaves the worker's copy unknown: the next one resends from 0. Any failure,
including the timeout (50 ms by default), raises: the engine then decodes that
request plainly, losing no token. Deterministic answers (every q row one-hot
at its token) are passed on without q, so they are verified by matching, like
any deterministic draft; otherwise q is the worker's sparse q, from which its
tokens were drawn.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import httpx
import torch

from draftgate.drafters.base import Abilities, Draft, DraftRequest, SparseQ, mass_at_drafts

__all__ = ["HttpDrafter", "DEFAULT_TIMEOUT_S"]

DEFAULT_TIMEOUT_S = 0.05


class HttpDrafter:
    name = "http"
    sampled_q = True  # the worker may serve a sampled model draft
    abilities = Abilities()  # none beyond the protocol

    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S, client: httpx.Client | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"draft worker URL must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = client or httpx.Client(timeout=timeout_s)
        self._prefix = uuid.uuid4().hex[:12]  # session ids unique across clients of one worker
        # seq_id -> the history the worker holds for its session (None: unknown, resend all)
        self._held: dict[int, list[int] | None] = {}

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        return [self._propose_one(r) if r.k > 0 and r.tokens else Draft([]) for r in requests]

    def _propose_one(self, r: DraftRequest) -> Draft:
        tokens = list(map(int, r.tokens))
        held = self._held.get(r.seq_id)
        self._held[r.seq_id] = None  # unknown until this call answers
        resp = self._post(r.seq_id, tokens, r, 0 if held is None else _common_prefix(held, tokens))
        if resp.status_code == 409:  # the worker lost the session (restart, eviction): resend all
            resp = self._post(r.seq_id, tokens, r, 0)
        resp.raise_for_status()
        self._held[r.seq_id] = tokens
        return _draft_from_json(resp.json(), r.k)

    def _post(self, seq_id: int, tokens: list[int], r: DraftRequest, offset: int) -> httpx.Response:
        p = r.params
        body = {
            "session_id": self._session_id(seq_id),
            "offset": offset,
            "tokens": tokens[offset:],
            "num_tokens": r.k,
            "temperature": p.temperature,
            "top_k": p.top_k,
            "top_p": p.top_p,
            "seed": p.seed,
        }
        return self._http.post(self.url + "/v1/propose", json=body)

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        pass  # the next propose() sends the new tokens

    def release(self, seq_id: int) -> None:
        if seq_id not in self._held:
            return
        del self._held[seq_id]
        try:
            self._http.delete(f"{self.url}/v1/sessions/{self._session_id(seq_id)}")
        except httpx.HTTPError:
            pass  # the worker evicts sessions it no longer hears about

    def close(self) -> None:
        self._http.close()

    def _session_id(self, seq_id: int) -> str:
        return f"{self._prefix}-{seq_id}"


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]: bisect with C-speed slice compares
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _draft_from_json(body: dict, k: int) -> Draft:  # type: ignore[type-arg]
    """Draft from the worker's answer; raises ValueError on an answer that does not fit."""
    toks = [int(t) for t in body["tokens"]]
    rows = body["q"]
    if len(toks) > k or len(rows) != len(toks):
        raise ValueError(f"draft worker returned {len(toks)} tokens and {len(rows)} q rows for k={k}")
    if not toks:
        return Draft([])
    M = max(len(row["ids"]) for row in rows)
    ids = torch.zeros(len(toks), M, dtype=torch.int64)  # [k, M]; padding: id 0 with prob 0
    probs = torch.zeros(len(toks), M, dtype=torch.float32)  # [k, M]
    for i, row in enumerate(rows):
        if len(row["ids"]) != len(row["probs"]) or not row["ids"]:
            raise ValueError(f"q row {i} is empty or its ids and probs differ in length")
        ids[i, : len(row["ids"])] = torch.tensor(row["ids"], dtype=torch.int64)
        probs[i, : len(row["probs"])] = torch.tensor(row["probs"], dtype=torch.float32)
    d = Draft(toks, SparseQ(ids, probs))
    at_x, total = mass_at_drafts(d)
    if not bool((at_x > 0).all()):
        raise ValueError("draft worker returned a token outside its own q")
    return Draft(toks) if bool((at_x == total).all()) else d
