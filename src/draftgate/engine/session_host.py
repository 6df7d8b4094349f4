"""SessionHost: a target worker's sessions with KV on this machine, run by the engine's own loop.

No gRPC here (``server.workers.target_server`` is the thin gRPC edge). Callers on any thread
``open`` a session, send it ``round``s of draft tokens, and ``close`` it; each call returns a
``concurrent.futures.Future``. A session is one ``Engine`` request over a ``LocalTarget``:

* *paced*: it takes a round only when its client sent one (``Engine.submit(ready=...)``), and
  every round the engine runs is one batched step over all sessions that have one (one ragged
  target forward, the same verification and rollback as the embedded engine);
* its drafts are the client's (``_SentDrafts``, at most the session's ``max_draft_tokens``),
  validated here (``drafters.base.draft_problem``): a draft that cannot be verified exactly makes
  its round a plain one, never a failed session;
* its first token is chosen as the engine chooses it, with the request's position-keyed
  uniforms, so a session replays plain decoding token for token, and the client's drafts change
  only how many tokens each round yields;
* the stateless Score call (``engine.scoring``) runs on the same loop (``Engine.call_soon``).

Answers are the engine's ``Chunk``s: the tokens a round kept (cut where plain decoding stops),
the drafts it accepted, and a finish reason at the end.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from draftgate.drafters.base import Abilities, Draft, DraftRequest, SparseQ, draft_problem
from draftgate.engine.backend import Chunk
from draftgate.engine.engine import Engine, EngineStopped, Submitted
from draftgate.engine.local_target import LocalTarget
from draftgate.engine.scoring import ScoredPosition, ScoreJob, score_positions
from draftgate.errors import BadRequestError
from draftgate.models.runner import ModelRunner
from draftgate.types import SamplingParams

__all__ = ["SessionHost", "SessionGone", "WorkerShuttingDown", "MAX_DRAFT_TOKENS"]

log = logging.getLogger("draftgate.worker")
MAX_DRAFT_TOKENS = 32  # most drafts a round may carry


class SessionGone(Exception):
    """The session is closed or finished; it takes no more rounds."""


class WorkerShuttingDown(SessionGone):
    """The worker is stopping: every session ends."""


@dataclass(eq=False)
class _Session:
    pending: cf.Future[Chunk]  # the open's answer, then the current round's
    draft: Draft | None = None  # the client's draft for the round it waits for (None: no round asked)
    ticket: Submitted | None = None
    finished: bool = False  # finished or closed: takes no more rounds
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ready(self) -> bool:
        """Whether its client sent a round (the engine's pacing)."""
        return self.draft is not None


def _resolve(fut: cf.Future, value: object = None, error: BaseException | None = None) -> None:  # type: ignore[type-arg]
    """Complete a future unless it is already done (a waiter that cancelled, an answered round)."""
    if fut.done():
        return
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)
    except cf.InvalidStateError:
        pass


class SessionHost:
    """Sessions over one ModelRunner, on one engine loop. Thread-safe public methods."""

    def __init__(self, runner: ModelRunner, model_name: str = "", max_batch: int = 64, max_queue: int = 1024) -> None:
        self.runner = runner
        self.model_name = model_name
        self._sessions: dict[int, _Session] = {}
        self._lock = threading.Lock()
        self._stopping = False
        self.sessions_total = 0  # sessions ever opened
        self.engine = Engine(
            LocalTarget(runner),
            _SentDrafts(self._sessions),
            k=MAX_DRAFT_TOKENS,
            k_max=MAX_DRAFT_TOKENS,
            max_batch=max_batch,
            max_queue=max_queue,
        )

    # ------------------------------------------------------------ public, any thread

    def shutdown(self) -> None:
        """Stop the loop; every session still open is failed and its KV freed."""
        self._stopping = True
        self.engine.shutdown()

    def open(
        self, prompt: Sequence[int], params: SamplingParams, max_draft_tokens: int
    ) -> tuple[int, cf.Future[Chunk]]:
        """Start a session; the future gives the first token. Raises BadRequestError on bad input."""
        if self._stopping:
            raise WorkerShuttingDown("the target worker is shutting down")
        if not 0 <= max_draft_tokens <= MAX_DRAFT_TOKENS:
            raise BadRequestError(f"max_draft_tokens must be in [0, {MAX_DRAFT_TOKENS}], got {max_draft_tokens}")
        sess = _Session(cf.Future())
        with self._lock:  # registered before the engine can answer it
            ticket = self.engine.submit(
                [int(t) for t in prompt],
                params,
                lambda c: self._answer(sess, c),
                k_max=max_draft_tokens,
                text=False,
                ready=sess.ready,
            )
            sess.ticket = ticket
            self._sessions[ticket.seq_id] = sess
            self.sessions_total += 1
        return ticket.seq_id, sess.pending

    def round(
        self, sid: int, draft: Sequence[int], q_rows: Sequence[tuple[Sequence[int], Sequence[float]]] = ()
    ) -> cf.Future[Chunk]:
        """Queue one round of drafts (q_rows: sparse q per draft, or empty for one-hot)."""
        d = self._check_draft(list(draft), q_rows)
        sess = self._sessions.get(sid)
        if sess is None or sess.finished:
            raise SessionGone("the session is not open (closed, finished or not started)")
        with sess.lock:
            if not sess.pending.done():
                raise BadRequestError("one round at a time per session")
            sess.pending = fut = cf.Future()
            sess.draft = d  # ready: the engine takes the round on its next turn
        self.engine.wake()
        return fut

    def close(self, sid: int) -> None:
        """End a session (idempotent); its KV is freed on the loop's next turn."""
        sess = self._sessions.get(sid)
        if sess is not None and sess.ticket is not None:
            sess.ticket()

    def score(self, tokens: Sequence[int], validation_offset: int, top_n: int) -> cf.Future[list[ScoredPosition]]:
        """Queue a stateless Score call (``engine.scoring``) on the loop thread. Raises BadRequestError."""
        if self._stopping:
            raise WorkerShuttingDown("the target worker is shutting down")
        job = ScoreJob.checked(self.runner, tokens, validation_offset, top_n)
        done = self.engine.call_soon(lambda: score_positions(self.runner, job))
        done.add_done_callback(lambda f: self._copy(f, job.future))
        return job.future

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    def health(self) -> dict[str, int | str]:
        kv = self.runner.kv.stats()
        return {
            "model": self.model_name,
            "vocab_size": self.runner.vocab_size,
            "max_context": self.runner.config.max_position_embeddings,
            "open_sessions": self.open_sessions,
            "kv_blocks_total": kv["num_blocks"],
            "kv_blocks_free": kv["free_blocks"],
            "kv_blocks_used": kv["used_blocks"],
        }

    # ------------------------------------------------------------ the engine's side

    def _answer(self, sess: _Session, c: Chunk) -> None:
        """A chunk of the session's request (engine thread): the pending open or round is answered."""
        with sess.lock:
            sess.draft = None  # the round is done: not ready until the client sends another
            fut = sess.pending
        if c.finish_reason is not None:
            sess.finished = True
            with self._lock:  # after open() registered it (it holds the lock while submitting)
                if sess.ticket is not None:
                    self._sessions.pop(sess.ticket.seq_id, None)
        if c.finish_reason == "error":
            _resolve(fut, error=RuntimeError(c.error or "the target failed"))
        elif c.finish_reason == "abort":
            gone = (
                WorkerShuttingDown("the target worker shut down")
                if self._stopping
                else SessionGone("the session was closed")
            )
            _resolve(fut, error=gone)
        else:
            _resolve(fut, c)

    def _copy(self, src: cf.Future, dst: cf.Future) -> None:  # type: ignore[type-arg]
        e = src.exception()
        if isinstance(e, EngineStopped):
            e = WorkerShuttingDown("the target worker shut down")
        _resolve(dst, None if e is not None else src.result(), e)

    # ------------------------------------------------------------------ validation

    def _check_draft(self, draft: list[int], q_rows: Sequence[tuple[Sequence[int], Sequence[float]]]) -> Draft:
        """The round's draft, or no draft (a plain round) if it cannot be verified exactly.

        The one validation every path uses (``drafters.base.draft_problem``): a bad draft costs its
        round's drafts, as in the embedded engine, never the session.
        """
        V = self.runner.vocab_size
        d = _to_draft(draft, q_rows)
        problem = "q rows do not match the draft tokens" if d is None else draft_problem(d, MAX_DRAFT_TOKENS, V)
        if problem is not None:
            log.warning("a round's draft cannot be verified (%s): this round decodes plainly", problem)
            return Draft([])
        assert d is not None
        return d


def _to_draft(draft: list[int], q_rows: Sequence[tuple[Sequence[int], Sequence[float]]]) -> Draft | None:
    if not q_rows:
        return Draft(draft)
    if len(q_rows) != len(draft) or any(len(ids) != len(probs) or not ids for ids, probs in q_rows):
        return None
    M = max(len(ids) for ids, _ in q_rows)
    ids_t = torch.zeros(len(draft), M, dtype=torch.int64)  # [K, M], padding: id 0 with prob 0
    probs_t = torch.zeros(len(draft), M, dtype=torch.float32)  # [K, M]
    for i, (ids, probs) in enumerate(q_rows):
        ids_t[i, : len(ids)] = torch.tensor([int(t) for t in ids], dtype=torch.int64)
        probs_t[i, : len(probs)] = torch.tensor([float(p) for p in probs], dtype=torch.float32)
    return Draft(draft, SparseQ(ids_t, probs_t))


def _cut(d: Draft, k: int) -> Draft:
    """The first k drafts (and their q rows): a round asks for no more than its sequence may take."""
    if len(d.token_ids) <= k:
        return d
    q = SparseQ(d.q.ids[:k], d.q.probs[:k]) if isinstance(d.q, SparseQ) else d.q
    return Draft(d.token_ids[:k], q)


class _SentDrafts:
    """The Drafter of a worker's engine: each session's round carries the draft its client sent."""

    name = "remote"
    sampled_q = True  # a client may send a sampled q
    abilities = Abilities()

    def __init__(self, sessions: dict[int, _Session]) -> None:
        self._sessions = sessions

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        out = []
        for r in requests:
            s = self._sessions.get(r.seq_id)
            d = s.draft if s is not None else None
            out.append(_cut(d, r.k) if d is not None else Draft([]))
        return out

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        pass

    def release(self, seq_id: int) -> None:
        pass
