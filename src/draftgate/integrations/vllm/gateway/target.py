"""VllmRoundTarget: the gateway drafts and verifies, a vLLM server scores (``vllm+http://`` rounds).

The round target (``engine.target.RoundTarget``) of a route whose target is a vLLM server
started with ``--enable-scale-out``; the request loop and the drafter are the engine's. Every
sequence keeps **a plain stream** open on vLLM: its own decoding from the sequence's history,
read by a thread of its own (``wire.VllmStream``). A round without drafts (and a request's
first token) takes the stream's next token, so plain stretches run at vLLM's own decode speed,
never one request per token (the hand-off).

A round with drafts is **scored while the stream goes on**: one request over history + drafts
(``VllmWire.score``, the prefix cache read); each row's argmax (``wire.read_row``: only
computed, well-formed rows) and vLLM's choice after the last draft become logits (0 at the
argmax, -inf elsewhere) that ``verify.verify_round`` verifies: token for token vLLM's greedy
choice. A scoring pass rounds differently from a decode step, so a row's argmax counts only where
it leads the runner-up by ``margin`` (``checks.check_numerics`` measures the difference at
start-up; the margin is 20 times it, at least 1e-3): a position closer than that is a *near tie*,
taken from the stream like a row vLLM did not compute (counted). The round then emits whichever
went further, the verified tokens or the stream's (the stream's where they differ: vLLM's own
decoding is the reference). A round that got ahead of the stream keeps it when the stream will
catch up sooner than a new one would start (the tokens it then sends are checked against those
emitted), else opens a new one past the round's end (the way back).

Nothing goes out unaccounted: a token the stream later sends otherwise than a round emitted is a
*contradiction* (logged, counted, the stream reopened from the history); a verified token the
stream never reached (it was reopened past it, or the request ended first) is *unconfirmed*
(counted). ``counts()`` holds the three; the server's /metrics exports them. A round that fails
in any way (an HTTP error, a timeout, a malformed answer, any exception) emits the stream's next
token instead (a ``fallback`` round); only a failed stream ends the request.

Which lookup drafts are worth a round is priced by what rounds cost on this server
(``pricing.RoundPricer``, measured here): the target declares it (``TargetInfo.pricer``) and
the engine's policy asks it of each lookup draft's evidence (``Draft.context``); a draft it
declines is never sent. A sampled request's drafts, and a sequence whose context vLLM keeps
cached past its end, decode plainly (``declined``).

Rows vLLM did not compute (a prefix it had cached past this context's end) are read from the
stream where it got there; a context another request carried past its end (a repeated prompt)
stops scoring for that sequence after twice.

Sampled requests run entirely on vLLM's own decoding (``VllmTargetEngine`` never drafts for
them): the output is vLLM's sampling, seeded by the request's seed, and the request's stats say
``target_decoded``. Exact by construction; no approximation.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from draftgate.engine import verify_choices
from draftgate.engine.round import Round
from draftgate.engine.target import TargetInfo, check_prompt
from draftgate.integrations.vllm.gateway.pricing import RoundPricer
from draftgate.integrations.vllm.gateway.wire import (
    GarbageRow,
    RowError,
    Scored,
    StreamError,
    VllmStream,
    VllmWire,
    WireError,
    margin,
    read_row,
    top1,
)
from draftgate.models.tokenizer import TextTokenizer
from draftgate.types import SamplingParams

__all__ = ["VllmRoundTarget", "MIN_MARGIN"]

MIN_MARGIN = 1e-3  # log-probability lead below which a scored argmax is a near tie (float32 CPU: 20x the 2e-5 seen)

log = logging.getLogger("draftgate.vllm_rounds")


@dataclass
class _Seq:
    """What one sequence holds on the server."""

    seq_id: int
    stream: VllmStream | None = None  # vLLM's own decoding, following history[: stream.base] + sent
    sent: list[int] = field(default_factory=list)  # emitted since the stream's base (rounds may pass the stream)
    checked: int = 0  # of those, the ones the stream has sent and that matched
    quiet_since: float = 0.0  # no scoring round of this sequence ran since (its gaps price a plain token)
    cached_past: int = 0  # rounds that found its context cached past its end by another request

    @property
    def taken(self) -> int:
        """The stream's positions emitted so far."""
        return len(self.sent)


class VllmRoundTarget:
    def __init__(
        self,
        wire: VllmWire,
        tokenizer: TextTokenizer,
        max_context: int | None,
        max_concurrent: int = 16,
        token_timeout_s: float = 30.0,
        margin: float = MIN_MARGIN,
    ) -> None:
        """``margin``: the lead (in log-probability) a scored row's argmax needs to count as vLLM's choice."""
        self.wire = wire
        self.margin = margin
        self.tokenizer = tokenizer
        self.pricer = RoundPricer()
        self.info = TargetInfo("vllm", tokenizer.vocab_size, max_context, exact_sampling=True, pricer=self.pricer)
        self.token_timeout_s = token_timeout_s
        self.scored = 0  # drafts scored on vLLM (the rest decode plainly; requests' stats count both)
        self.near_ties = 0  # positions whose scored argmax led by less than the margin (the stream's token taken)
        self.contradicted = 0  # emitted tokens the stream later sent otherwise (0 on a sound server)
        self.unconfirmed = 0  # verified tokens emitted that no stream reached (reopened past, or the request ended)
        self._seqs: dict[int, _Seq] = {}
        self._lock = threading.Lock()
        self._max_concurrent = max_concurrent
        self._pool: cf.ThreadPoolExecutor | None = None

    # ---------------------------------------------------------------- RoundTarget

    def check(self, prompt_ids: Sequence[int], params: SamplingParams, k_max: int) -> None:
        check_prompt(prompt_ids, params.max_new_tokens, self.info.vocab_size, self.info.max_context)

    def open(self, rnd: Round) -> None:
        self._round(rnd)  # the first token is the plain stream's first token

    def run(self, rounds: Sequence[Round]) -> None:
        if len(rounds) <= 1:
            for r in rounds:
                self._round(r)
            return
        with self._lock:
            if self._pool is None:
                self._pool = cf.ThreadPoolExecutor(self._max_concurrent, thread_name_prefix="draftgate-vllm")
        list(self._pool.map(self._round, rounds))

    def close(self, seq_id: int) -> None:
        with self._lock:
            s = self._seqs.pop(seq_id, None)
        if s is not None:
            self._drop(s)

    def kv_stats(self) -> dict[str, int]:
        return {}  # vLLM's KV cache: see its /metrics

    def counts(self) -> dict[str, int]:
        """What verification on this server left to the stream or could not confirm (see the module doc)."""
        with self._lock:
            return {"near_ties": self.near_ties, "contradicted": self.contradicted, "unconfirmed": self.unconfirmed}

    def _count(self, name: str, n: int = 1) -> None:
        if n:
            with self._lock:
                setattr(self, name, getattr(self, name) + n)

    def shutdown(self) -> None:
        with self._lock:
            seqs, self._seqs = list(self._seqs.values()), {}
            pool, self._pool = self._pool, None
        for s in seqs:
            self._drop(s)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    # ---------------------------------------------------------------- rounds

    def _round(self, w: Round) -> None:
        with self._lock:
            s = self._seqs.setdefault(w.seq_id, _Seq(w.seq_id))
        drafts = list(w.draft.token_ids)
        if self.info.max_context is not None:  # history + drafts must fit vLLM's context
            drafts = drafts[: max(0, self.info.max_context - len(w.history))]
        try:
            if drafts and w.params.greedy and s.cached_past < 2:
                self.scored += 1
                try:
                    self._scored(s, w, drafts)
                except StreamError:
                    raise
                except Exception as e:  # noqa: BLE001 -- any failure of a round is a fallback round
                    log.warning("vLLM scoring round failed (%s: %s): the stream's token instead", type(e).__name__, e)
                    self._plain(s, w, fallback=True)
            else:
                self._plain(s, w, declined=bool(drafts))
        except Exception as e:  # noqa: BLE001 -- the stream failed: this sequence ends, the batch goes on
            self._drop(s)
            w.fail(f"vLLM at {self.wire.url} failed mid-request: {type(e).__name__}: {e}")

    def _stream(self, s: _Seq, w: Round) -> VllmStream:
        """The sequence's stream, following w.history (a new one if it does not)."""
        st = s.stream
        if st is not None and st.base + s.taken == len(w.history) and self._agrees(s, st.snapshot()):
            return st
        self._drop(s)
        s.stream = self.wire.stream(w.history, w.params, max(1, w.remaining), w.params.cache_salt)
        return s.stream

    def _agrees(self, s: _Seq, toks: list[int]) -> bool:
        """Whether the stream's tokens past those checked are the ones emitted there (the ones it sent so far)."""
        got, emitted = toks[s.checked : s.taken], s.sent[s.checked : len(toks)]
        if emitted != got:  # vLLM's decoding chose otherwise than its scored row: emitted, so counted
            i = next(j for j, (a, b) in enumerate(zip(emitted, got, strict=True)) if a != b)
            wrong = s.taken - (s.checked + i)
            self._count("contradicted", wrong)
            log.warning(
                "vLLM's own decoding contradicts %d emitted token(s) of sequence %d (%d vs %d emitted): a scoring "
                "pass and a decode step disagreed past the margin %.3g, or the server answered wrongly",
                wrong,
                s.seq_id,
                got[i],
                emitted[i],
                self.margin,
            )
            s.checked = s.taken  # counted: not unconfirmed as well
            return False
        s.checked += len(got)
        return True

    def _drop(self, s: _Seq) -> None:
        """Close the stream; what it sent is checked first, what it never reached is counted unconfirmed."""
        if s.stream is not None:
            s.stream.close()
            self._agrees(s, s.stream.snapshot())
            self._count("unconfirmed", s.taken - s.checked)
        s.stream, s.sent, s.checked = None, [], 0

    def _next(self, s: _Seq, w: Round) -> list[int]:
        """The stream's tokens past what was emitted: at least one (waits for it)."""
        st = self._stream(s, w)
        toks = st.wait(s.taken + 1, self.token_timeout_s)
        if len(toks) <= s.taken or not self._agrees(s, toks):  # it ended (max_tokens), or went elsewhere
            self._drop(s)
            st = self._stream(s, w)
            toks = st.wait(1, self.token_timeout_s)
            if not toks:
                raise StreamError("vLLM's stream ended without a token")
        i = s.taken
        if i == 0:
            self.pricer.observe_open(st.arrivals[0] - st.started)
        elif st.arrivals[i - 1] >= s.quiet_since:
            self.pricer.observe_gap(st.arrivals[i] - st.arrivals[i - 1])
        return toks[s.taken :]

    def _plain(self, s: _Seq, w: Round, declined: bool = False, fallback: bool = False) -> None:
        """The next token of vLLM's own decoding (greedy, or the request's seeded sampling)."""
        tok = self._next(s, w)[0]
        s.sent.append(tok)
        s.checked = s.taken
        w.done([tok], target_decoded=not w.params.greedy, declined=declined, fallback=fallback)

    def _scored(self, s: _Seq, w: Round, drafts: list[int]) -> None:
        """Score the drafts on vLLM while its stream goes on; keep whichever is further, never a wrong token."""
        t0 = time.perf_counter()
        n, ids = len(w.history), list(w.history) + drafts
        st = self._stream(s, w)
        ahead = st.snapshot()[s.taken :]
        if ahead and ahead[0] != drafts[0]:  # the stream already answered: the first draft is wrong, no request
            self._keep(s, w, drafts, ahead, t0, fallback=False, priced=False)
            return
        try:
            got = self.wire.score(ids, w.params.cache_salt, from_row=n)
            rows = [_choice(got, ids, n + j, self.margin) for j in range(len(drafts))]  # argmax after drafts[:j]
        except (WireError, httpx.HTTPError) as e:  # an error, a timeout, a garbage row: never a wrong token
            log.warning("vLLM scoring round failed (%s): the stream's tokens are emitted instead", e)
            self._keep(s, w, drafts, self._next(s, w), t0, fallback=True)
            return
        ahead = st.snapshot()[s.taken :]
        # A row not computed lies in a prefix vLLM had cached past this context's end. Where its
        # stream got there, the stream's token is vLLM's choice (wait a step or two for it). Where
        # another request did (a repeated context), the stream's tokens are this round's, and after
        # twice the sequence stops scoring: reading those rows would need its whole context
        # prefilled again under a cache salt, which costs more than a 2-core CPU's rounds save.
        if sum(r is None for r in rows) > len(ahead) + 2:
            s.cached_past += 1
            self._keep(s, w, drafts, self._next(s, w), t0, fallback=False, priced=False)
            return
        choice: list[int] = []
        for j, row in enumerate(rows):
            if row is None or row is _NEAR_TIE:  # not computed, or too close to call: vLLM's own decoding says
                self._count("near_ties", row is _NEAR_TIE)
                if j >= len(ahead):
                    ahead = st.wait(s.taken + j + 1, self.token_timeout_s)[s.taken :]
                    if len(ahead) <= j:
                        raise StreamError("vLLM's stream ended inside a round")
                row = ahead[j]
            assert isinstance(row, int)
            choice.append(row)
            if row != drafts[j]:
                break  # rows past the first mismatch are not needed
        done = len(choice) == len(drafts) and choice[-1] == drafts[-1]  # every draft matched
        bonus = got.token if done and got.token_margin >= self.margin else None
        self._count("near_ties", done and bonus is None)
        emitted, _ = verify_choices(drafts, choice, bonus, self.info.vocab_size)
        self._keep(s, w, drafts, ahead, t0, fallback=False, verified=emitted)

    def _keep(
        self,
        s: _Seq,
        w: Round,
        drafts: list[int],
        ahead: list[int],
        t0: float,
        fallback: bool,
        verified: list[int] | None = None,
        priced: bool = True,
    ) -> None:
        """Emit the verified tokens or the stream's, whichever go further (the stream's where they differ)."""
        out, reopen = ahead, False
        if verified is not None:
            i = 0
            while i < min(len(verified), len(ahead)) and verified[i] == ahead[i]:
                i += 1
            if i < min(len(verified), len(ahead)):  # numerics: vLLM's own decoding is the reference
                out = ahead[: i + 1]
            elif len(verified) > len(ahead):
                out = verified
                # Past where the stream is: wait for it to catch up, or open a new stream from the round's end.
                step = self.pricer.step()
                reopen = step is None or (len(verified) - len(ahead)) * step > self.pricer.reopen_cost() + step
        if not out:
            out = self._next(s, w)[:1]
        s.checked = s.taken + min(len(out), len(ahead))
        s.sent.extend(out)
        if reopen:
            self._drop(s)  # vLLM's stream is far behind: a new one from past the round's tokens
        s.quiet_since = time.perf_counter()
        if priced:
            self.pricer.observe_round(w.draft.context, len(out), s.quiet_since - t0, reopen)
        log.debug(
            "round ctx=%d k=%d verified=%s ahead=%d out=%d %.1f ms reopen=%s",
            w.draft.context,
            len(drafts),
            None if verified is None else len(verified),
            len(ahead),
            len(out),
            (s.quiet_since - t0) * 1e3,
            reopen,
        )
        accepted = 0
        while accepted < min(len(drafts), len(out)) and drafts[accepted] == out[accepted]:
            accepted += 1
        w.done(out, accepted, fallback=fallback)


_NEAR_TIE = object()  # a row whose argmax leads by less than the margin


def _choice(got: Scored, ids: list[int], m: int, lead: float) -> int | object | None:
    """vLLM's argmax at row m; None if the row was not computed, _NEAR_TIE if its argmax leads by less
    than ``lead``; GarbageRow if it is not well formed."""
    try:
        row = read_row(got, ids, m)
    except GarbageRow:
        raise
    except RowError:
        return None
    return top1(row) if margin(row) >= lead else _NEAR_TIE
