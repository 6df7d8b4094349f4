"""SessionHost: a target worker's sessions with KV on this machine, verified in batched rounds.

No gRPC here (``target_server`` is the thin gRPC edge). Callers on any thread
``open`` a session, send it ``round``s of draft tokens, and ``close`` it; each
call returns a ``concurrent.futures.Future``. One loop thread owns the model:
every turn it

1. drains the inbox (closes first: a closed session's KV is freed at once),
2. admits one waiting session (prefill, first token) if its KV reserve fits,
3. answers one stateless ``score`` call (``engine.scoring``),
4. runs every queued round of every session in ONE ``speculative_step`` batch
   on the engine's own ``LocalTarget`` (one ragged target forward, the same
   verification and rollback as the embedded engine).

A session's first token is chosen as the engine chooses it (``LocalTarget.open``
with the request's position-keyed uniforms), so a session replays plain
decoding token for token, and the client's drafts change only how many tokens
each round yields.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import queue
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from draftgate.drafters.base import Abilities, Draft, DraftRequest, SparseQ, draft_problem
from draftgate.engine.local_target import LocalTarget
from draftgate.engine.scoring import ScoredPosition, ScoreJob, score_positions
from draftgate.engine.sequence import PositionRandom, SequenceState, StopChecker
from draftgate.engine.step import round_work, speculative_step
from draftgate.engine.target import NotNow, check_prompt
from draftgate.errors import BadRequestError
from draftgate.models.runner import ModelRunner
from draftgate.types import SamplingParams

__all__ = ["RoundResult", "SessionHost", "SessionGone", "WorkerShuttingDown", "MAX_DRAFT_TOKENS"]

log = logging.getLogger("draftgate.worker")
MAX_DRAFT_TOKENS = 32  # most drafts a round may carry


class SessionGone(Exception):
    """The session is closed or finished; it takes no more rounds."""


class WorkerShuttingDown(SessionGone):
    """The worker is stopping: every session ends."""


@dataclass(frozen=True)
class RoundResult:
    tokens: list[int]  # emitted, already cut where plain decoding stops
    num_accepted: int
    finish_reason: str | None  # "stop" | "length" | None


@dataclass
class _Session:
    seq: SequenceState
    k_max: int
    opened: cf.Future[RoundResult]
    prefilled: bool = False
    done: bool = False  # finished or closed: KV freed


@dataclass
class _Round:
    sid: int
    draft: Draft
    future: cf.Future[RoundResult]


@dataclass
class _Inbox:
    closes: list[int] = field(default_factory=list)
    rounds: list[_Round] = field(default_factory=list)


def _resolve(fut: cf.Future, value: object = None, error: BaseException | None = None) -> None:  # type: ignore[type-arg]
    """Complete a future unless its waiter cancelled it (a client that went away)."""
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
    """Sessions over one ModelRunner, batched by one loop thread. Thread-safe public methods."""

    def __init__(self, runner: ModelRunner, model_name: str = "", max_batch: int = 64) -> None:
        self.runner = runner
        self.target = LocalTarget(runner)  # sessions' KV, prefill, rounds and rollback
        self.model_name = model_name
        self.max_batch = max_batch
        self._sessions: dict[int, _Session] = {}  # by seq_id; touched by the loop thread only
        self._waiting: deque[_Session] = deque()  # opened, waiting for their KV reserve
        self._pending_rounds: list[_Round] = []  # rounds left over when a batch was full
        self._scores: deque[ScoreJob] = deque()
        self._inbox: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self._open_count = 0  # sessions opened and not yet closed (any thread reads it)
        self.sessions_total = 0  # sessions ever opened
        self._count_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ public, any thread

    def start(self) -> SessionHost:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="draftgate-target", daemon=True)
            self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop the loop; every session still open is failed and its KV freed."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        gone = WorkerShuttingDown("the target worker shut down")
        inbox = self._drain_inbox()
        for job in [*inbox.rounds, *self._scores]:
            _resolve(job.future, error=gone)
        self._scores.clear()
        for sid in list(self._sessions):
            self._close(sid, gone)

    def open(
        self, prompt: Sequence[int], params: SamplingParams, max_draft_tokens: int
    ) -> tuple[int, cf.Future[RoundResult]]:
        """Start a session; the future gives the first token. Raises BadRequestError on bad input."""
        params.validate()
        prompt = [int(t) for t in prompt]
        check_prompt(prompt, params.max_new_tokens, self.runner.vocab_size, self.target.info.max_context)
        if not 0 <= max_draft_tokens <= MAX_DRAFT_TOKENS:
            raise BadRequestError(f"max_draft_tokens must be in [0, {MAX_DRAFT_TOKENS}], got {max_draft_tokens}")
        need = self._blocks_for(len(prompt) + params.max_new_tokens + max_draft_tokens + 1)
        if need > self.runner.kv.num_blocks:
            raise BadRequestError(
                f"the session needs {need} KV blocks but the worker has {self.runner.kv.num_blocks}; "
                "lower max_tokens or start the worker with more --kv-blocks"
            )
        gen = torch.Generator()
        gen.manual_seed(params.seed if params.seed is not None else int(torch.randint(0, 2**62, (1,))))
        seq = SequenceState(prompt, params, PositionRandom(gen), StopChecker(self.runner.tokenizer, params))
        sess = _Session(seq, max_draft_tokens, cf.Future())
        with self._count_lock:
            self._open_count += 1
            self.sessions_total += 1
        try:
            self._put("open", sess)
        except WorkerShuttingDown:
            with self._count_lock:
                self._open_count -= 1
            raise
        return seq.seq_id, sess.opened

    def round(
        self, sid: int, draft: Sequence[int], q_rows: Sequence[tuple[Sequence[int], Sequence[float]]] = ()
    ) -> cf.Future[RoundResult]:
        """Queue one round of drafts (q_rows: sparse q per draft, or empty for one-hot)."""
        fut: cf.Future[RoundResult] = cf.Future()
        d = self._check_draft(list(draft), q_rows)
        self._put("round", _Round(sid, d, fut))
        return fut

    def close(self, sid: int) -> None:
        """End a session (idempotent); its KV is freed on the loop's next turn."""
        self._put("close", sid)

    def score(self, tokens: Sequence[int], validation_offset: int, top_n: int) -> cf.Future[list[ScoredPosition]]:
        """Queue a stateless Score call (``engine.scoring``); the loop thread runs it. Raises BadRequestError."""
        job = ScoreJob.checked(self.runner, tokens, validation_offset, top_n)
        self._put("score", job)
        return job.future

    @property
    def open_sessions(self) -> int:
        return self._open_count

    def health(self) -> dict[str, int | str]:
        kv = self.runner.kv.stats()
        return {
            "model": self.model_name,
            "vocab_size": self.runner.vocab_size,
            "max_context": self.runner.config.max_position_embeddings,
            "open_sessions": self._open_count,
            "kv_blocks_total": kv["num_blocks"],
            "kv_blocks_free": kv["free_blocks"],
            "kv_blocks_used": kv["used_blocks"],
        }

    # ------------------------------------------------------------------ validation

    def _check_draft(self, draft: list[int], q_rows: Sequence[tuple[Sequence[int], Sequence[float]]]) -> Draft:
        """The round's draft, or no draft (a plain round) if it cannot be verified exactly.

        The one validation every path uses (``drafters.base.draft_problem``): a bad draft costs its
        round's drafts, as in the embedded engine, never the session.
        """
        V = self.runner.vocab_size
        d = self._to_draft(draft, q_rows)
        problem = "q rows do not match the draft tokens" if d is None else draft_problem(d, MAX_DRAFT_TOKENS, V)
        if problem is not None:
            log.warning("a round's draft cannot be verified (%s): this round decodes plainly", problem)
            return Draft([])
        assert d is not None
        return d

    @staticmethod
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

    def _blocks_for(self, n_tokens: int) -> int:
        return math.ceil(n_tokens / self.runner.block_size)

    # ------------------------------------------------------------------ the loop

    def _put(self, kind: str, item: object) -> None:
        if self._stop:
            raise WorkerShuttingDown("the target worker is shutting down")
        self._inbox.put((kind, item))
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop:
            inbox = self._drain_inbox()
            for sid in inbox.closes:
                self._close(sid, SessionGone("the session was closed"))
            busy = self._admit_one()
            busy |= self._score_one()
            busy |= self._run_rounds(inbox.rounds)
            if not busy and self._inbox.empty():
                self._wake.wait(timeout=0.5)
                self._wake.clear()

    def _drain_inbox(self) -> _Inbox:
        """Move queued work to its place; returns the closes and rounds to handle this turn."""
        out = _Inbox()
        while True:
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "open":
                assert isinstance(item, _Session)
                self._sessions[item.seq.seq_id] = item
                self._waiting.append(item)
            elif kind == "close":
                assert isinstance(item, int)
                out.closes.append(item)
            elif kind == "round":
                assert isinstance(item, _Round)
                out.rounds.append(item)
            else:
                assert isinstance(item, ScoreJob)
                self._scores.append(item)
        out.rounds = self._pending_rounds + out.rounds
        self._pending_rounds = []
        return out

    def _close(self, sid: int, why: BaseException) -> None:
        sess = self._sessions.pop(sid, None)
        if sess is None:
            return
        if sess in self._waiting:
            self._waiting.remove(sess)
        _resolve(sess.opened, error=why)
        self._release(sess)
        with self._count_lock:
            self._open_count -= 1

    def _release(self, sess: _Session) -> None:
        """Free the session's KV (once) and its reserve; it stays registered until closed."""
        if sess.done:
            return
        sess.done = True
        self.target.close(sess.seq.seq_id)

    def _admit_one(self) -> bool:
        """Prefill the first waiting session whose reserve fits (FIFO: no overtaking)."""
        if not self._waiting:
            return False
        sess = self._waiting[0]
        s = sess.seq
        try:
            done = self.target.open(round_work(s, Draft([])), sess.k_max)
        except NotNow:
            return False
        self._waiting.popleft()
        if done.error is not None:  # a failed prefill fails this session only (its KV is freed)
            sess.done = True
            self.target.close(s.seq_id)
            _resolve(sess.opened, error=RuntimeError(done.error))
            return True
        sess.prefilled = True
        kept = s.append(done.emitted)
        if s.finish_reason is not None:
            self._release(sess)
        _resolve(sess.opened, RoundResult(kept, 0, s.finish_reason))
        return True

    def _run_rounds(self, rounds: list[_Round]) -> bool:
        """All queued rounds (one per session at most) in one speculative step."""
        batch: dict[int, _Round] = {}
        for r in rounds:
            sess = self._sessions.get(r.sid)
            if sess is None or sess.done or not sess.prefilled:
                _resolve(r.future, error=SessionGone("the session is not open (closed, finished or not started)"))
            elif r.sid in batch:
                _resolve(r.future, error=BadRequestError("one round at a time per session"))
            elif len(batch) >= self.max_batch:
                self._pending_rounds.append(r)
            elif len(r.draft.token_ids) > sess.k_max:  # more drafts than its KV reserve: a plain round
                batch[r.sid] = _Round(r.sid, Draft([]), r.future)
            else:
                batch[r.sid] = r
        if not batch:
            return False
        sessions = [self._sessions[sid] for sid in batch]
        sent = _SentDrafts({sid: r.draft for sid, r in batch.items()})
        ks = [len(r.draft.token_ids) for r in batch.values()]
        try:
            res = speculative_step(self.target, sent, [s.seq for s in sessions], ks)
        except Exception as e:  # the target failed: each session in the batch hears it
            for r in batch.values():
                _resolve(r.future, error=e)
            return True
        for sess, r, rnd in zip(sessions, batch.values(), res.rounds, strict=True):
            if rnd.error is not None:
                self._release(sess)
                _resolve(r.future, error=RuntimeError(rnd.error))
                continue
            if sess.seq.finish_reason is not None:
                self._release(sess)
            _resolve(r.future, RoundResult(rnd.emitted, rnd.accepted, sess.seq.finish_reason))
        return True

    def _score_one(self) -> bool:
        if not self._scores:
            return False
        job = self._scores.popleft()
        if job.future.set_running_or_notify_cancel():
            try:
                job.future.set_result(score_positions(self.runner, job))
            except Exception as e:
                job.future.set_exception(e)
        return True


class _SentDrafts:
    """A Drafter that returns the drafts the sessions' clients sent (for speculative_step)."""

    name = "remote"
    sampled_q = True  # a client may send a sampled q
    abilities = Abilities()

    def __init__(self, drafts: dict[int, Draft]) -> None:
        self._drafts = drafts

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        return [self._drafts[r.seq_id] for r in requests]

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        pass

    def release(self, seq_id: int) -> None:
        pass
