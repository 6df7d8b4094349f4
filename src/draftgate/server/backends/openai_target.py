"""OpenAITargetEngine: a route whose target is an OpenAI-compatible completion server we do not own.

The draft loop runs in the gateway (any local drafter: n-gram, suffix, auto...);
each round verifies the drafts with ONE request to the server:

    POST /v1/completions {prompt: text(history + drafts), max_tokens: 1, echo: true,
                          logprobs: 1, temperature: 0}

and reads, for every draft position and the one after, the server's top-1
token from the echoed prompt log-probabilities. Greedy acceptance: the longest
prefix of drafts equal to the server's argmax, then the server's argmax at the
first mismatch (or after the last draft). That is exactly the server's own
greedy decoding (up to the server's numerics: see below), and the server's
prefix cache (llama.cpp keeps the previous request's KV and reuses the common
prefix) makes a round cost about one forward over K+1 new tokens.

Written against llama-cpp-python's server (0.3.x), whose quirks this relies on
and checks:

* it must run with ``--logits_all true`` (prompt log-probabilities need every
  position's logits; without it every round fails with a clear error);
* it accepts text prompts only (no token-id lists), so the history is sent as
  text with its special tokens and re-tokenized by the server; every round
  checks that the server's echoed tokens are ours (count and strings) and fails
  the request with a clear error when they are not (never a silent drift);
* it pairs each echoed token with the distribution after the token *before*
  it only when the prompt starts with BOS (it drops a leading BOS, then zips
  tokens with score rows); without a leading BOS every entry is shifted by
  one; tokens equal to its BOS id are skipped in the lists and the first entry
  is null. All of this is mapped explicitly and the layout is checked (entry
  count and echoed strings) on every round. Entries are keyed by token *string*: strings map
  back to ids through the route's tokenizer (the same GGUF). Two strings are
  shared by several ids and resolved by rule (counted in ``TokenPieces.resolved``,
  NOT exact if the server's choice was the other id): text that byte-fragment
  tokens share with a complete token is read as the complete token, and ""
  (every special token prints as "") is read as EOS. Any other shared string
  ends the request with an error.

Sampling (temperature > 0) is refused at submit time (HTTP 400) unless the
route sets ``allow_approximate``: the server's top-n log-probabilities do not
carry the full distribution, so the verifier then accepts a draft x with
probability p_top-n(x) and resamples from the renormalised top-n residual --
an approximation, reported as ``approximate`` on the request's stats and
counted in ``approximate_requests``.

Cost note (informal, llama-cpp-python 0.3.x): its echo+logprobs path sorts
the full vocabulary in Python for every prompt position of every request, so a
round costs O(history x V log V) on the server; long histories make this back
end slow there. Servers with proper prompt_logprobs (vLLM) do not have that cost
but are not handled by this module's layout checks yet.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import httpx

from draftgate.drafters.base import Drafter, DraftRequest
from draftgate.engine.engine import _Detok
from draftgate.engine.frontend import Chunk, Frontend
from draftgate.engine.sequence import StopChecker
from draftgate.errors import BadRequestError, CapacityError
from draftgate.models.tokenizer import TextTokenizer
from draftgate.types import SamplingParams, SpecStats

__all__ = ["OpenAITargetEngine", "VerifyError"]

log = logging.getLogger("draftgate.openai_target")
Sink = Callable[[Chunk], None]
_ids = itertools.count(1)
DEFAULT_K = 4
APPROX_TOP_N = 10


class VerifyError(RuntimeError):
    """The server's answer cannot be read exactly (layout, re-tokenization, ambiguous strings)."""


class RetokenizeError(VerifyError):
    """The server's tokens for the text are not the gateway's ids."""


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2 byte-level BPE: the printable character each byte is written as -> the byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


class TokenPieces:
    """Each id's text as llama.cpp's server prints it (its bytes, UTF-8 with errors ignored; specials "")."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        inv = _bytes_to_unicode()
        special: set[int] = set()
        inner = getattr(tokenizer, "_tok", None)
        if inner is not None and hasattr(inner, "get_added_tokens_decoder"):
            special = {int(i) for i, t in inner.get_added_tokens_decoder().items() if getattr(t, "special", True)}
        self.pieces: list[str] = []
        self.by_piece: dict[str, list[int]] = {}
        self.clean: dict[str, int] = {}  # string -> the one id whose bytes are complete UTF-8 with that text
        self.resolved = 0  # strings that several ids share, resolved to the complete-UTF-8 id (or EOS)
        self.eos = tokenizer.eos_ids[0] if tokenizer.eos_ids else -1
        for i in range(tokenizer.vocab_size):
            tok = tokenizer.id_to_token(i)
            if tok is None or i in special:
                s = ""
            elif all(ch in inv for ch in tok):
                raw = bytes(inv[ch] for ch in tok)
                s = raw.decode("utf-8", errors="ignore")
                try:
                    if raw.decode("utf-8") == s:
                        self.clean.setdefault(s, i)
                except UnicodeDecodeError:
                    pass
            else:
                s = tokenizer.decode([i], skip_special=False)
            self.pieces.append(s)
            self.by_piece.setdefault(s, []).append(i)

    def to_id(self, s: str) -> int:
        ids = self.by_piece.get(s, [])
        if len(ids) == 1:
            return ids[0]
        if s == "" and self.eos in ids:
            # llama.cpp prints special tokens as "": an empty argmax is read as EOS (the special token a
            # model chooses in practice). Not exact if the server chose another special token.
            self.resolved += 1
            return self.eos
        if len(ids) > 1 and s in self.clean:
            # Byte-fragment tokens print as their complete characters only (llama.cpp drops the
            # fragment): take the complete-UTF-8 token. Not exact if the server's choice was a fragment.
            self.resolved += 1
            return self.clean[s]
        raise VerifyError(
            f"the server's token {s!r} maps to {len(ids)} ids of the route's tokenizer; it cannot be verified exactly"
        )


@dataclass
class _Req:
    prompt: list[int]
    params: SamplingParams
    sink: Sink
    detok: _Detok
    seq_id: int = field(default_factory=lambda: next(_ids))
    history: list[int] = field(default_factory=list)
    output: list[int] = field(default_factory=list)
    stats: SpecStats = field(default_factory=SpecStats)
    cancelled: threading.Event = field(default_factory=threading.Event)
    drafter_failed: bool = False
    started: bool = False

    def __post_init__(self) -> None:
        self.history = list(self.prompt)


class OpenAITargetEngine(Frontend):
    """Backend for gateway routes with ``target: openai+http://HOST:PORT``."""

    def __init__(
        self,
        url: str,
        tokenizer: TextTokenizer,
        drafter: Drafter | None,
        k: int | None = None,
        k_max: int = 8,
        max_queue: int = 256,
        allow_approximate: bool = False,
        timeout_s: float = 60.0,
        max_concurrent: int = 4,
        model_name: str | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.tokenizer = tokenizer
        self.drafter = drafter
        self.k = k
        self.k_max = k_max
        self.max_queue = max_queue
        self.allow_approximate = allow_approximate
        self.model_name = model_name
        self.speculation_enabled = drafter is not None
        self.stats = SpecStats(drafter=drafter.name if drafter else "none")
        self.approximate_requests = 0
        self.rounds = 0
        self.http_s = 0.0  # time spent waiting for the server (all rounds)
        self._http = client or httpx.Client(timeout=timeout_s)
        self._pieces: TokenPieces | None = None
        self._bos = tokenizer.bos_id
        self._lock = threading.Lock()
        self._draft_lock = threading.Lock()  # drafters need not be thread-safe
        self._running = 0
        self._waiting = 0
        self._max_concurrent = max_concurrent
        self._pool: cf.ThreadPoolExecutor | None = None

    # ----------------------------------------------------------------- Backend

    @property
    def num_running(self) -> int:
        return self._running

    @property
    def num_waiting(self) -> int:
        return self._waiting

    def kv_stats(self) -> dict[str, int]:
        return {}  # the server's KV is not ours to see

    def start(self) -> OpenAITargetEngine:
        with self._lock:
            if self._pool is None:
                self._pool = cf.ThreadPoolExecutor(self._max_concurrent, thread_name_prefix="draftgate-openai")
        return self

    def shutdown(self) -> None:
        pool = self._pool
        self._pool = None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
            transport = getattr(self._http, "_transport", None)
            if isinstance(transport, httpx.MockTransport):
                return  # a test's client: keep it
            self._http.close()
            self._http = httpx.Client(timeout=self._http.timeout)  # restartable

    def check_params(self, params: SamplingParams) -> None:
        """The refusal: sampling on this back end is only served when the route allows approximation."""
        if params.temperature > 0 and not self.allow_approximate:
            raise BadRequestError(
                "this model's target is an OpenAI-compatible server verified through its prompt log-probabilities, "
                "which is exact only for greedy decoding: send temperature 0, or ask the operator to enable "
                "approximate mode (allow_approximate) for this route"
            )

    def submit(self, prompt_ids: list[int], params: SamplingParams, sink: Sink) -> Callable[[], None]:
        params.validate()
        self.check_params(params)
        V = self.tokenizer.vocab_size
        if not prompt_ids or any(not isinstance(t, int) or not 0 <= t < V for t in prompt_ids):
            raise BadRequestError(f"prompt token ids must be a non-empty list of ids in [0, {V})")
        with self._lock:
            if self._running + self._waiting >= self.max_queue:
                raise CapacityError("too many requests in flight to the target server; retry later")
            self._waiting += 1
        if params.seed is None:
            params = replace(params, seed=random.getrandbits(62))
        r = _Req(list(prompt_ids), params, sink, _Detok(StopChecker(self.tokenizer, params)))
        r.stats.drafter = self.stats.drafter
        self.start()
        assert self._pool is not None
        self._pool.submit(self._serve, r)
        return r.cancelled.set

    # ----------------------------------------------------------------- the loop

    def _serve(self, r: _Req) -> None:
        with self._lock:
            self._waiting -= 1
            self._running += 1
        r.started = True
        rng = random.Random(r.params.seed)
        try:
            if r.params.temperature > 0:
                with self._lock:
                    self.approximate_requests += 1
                r.stats.approximate = True  # type: ignore[attr-defined]  # rendered where supported
            while True:
                if r.cancelled.is_set():
                    self._end(r, [], "abort")
                    return
                new, accepted, k = self._round(r, rng)
                keep, reason = r.detok.checker.cut(r.output, new)
                new = new[:keep]
                r.stats.record_round(k, accepted, len(new) if reason else accepted + 1)
                with self._lock:
                    self.stats.record_round(k, accepted, accepted + 1)
                r.output.extend(new)
                r.history.extend(new)
                if k and self.drafter is not None:
                    self._drafter_call(self.drafter.observe, r.seq_id, tuple(r.history), k, accepted)
                if reason is not None:
                    self._end(r, new, reason)
                    return
                self._deliver(r, Chunk(new, r.detok.delta(self.tokenizer.decode, new, final=False), prompt_tokens=len(r.prompt)))
        except Exception as e:
            log.warning("request %d failed: %s: %s", r.seq_id, type(e).__name__, e)
            self._end(r, [], "error", error=f"target server: {type(e).__name__}: {e}")
        finally:
            with self._lock:
                self._running -= 1
            if self.drafter is not None:
                self._drafter_call(self.drafter.release, r.seq_id)

    def _drafter_call(self, fn: Callable[..., object], *args: object) -> object:
        with self._draft_lock:
            try:
                return fn(*args)
            except Exception as e:
                log.warning("drafter bookkeeping failed: %s: %s", type(e).__name__, e)
                return None

    def _choose_k(self, r: _Req) -> int:
        if self.drafter is None or not self.speculation_enabled or r.drafter_failed:
            return 0
        remaining = r.params.max_new_tokens - len(r.output)
        k = self.k if self.k is not None else min(DEFAULT_K, self.k_max)
        return max(0, min(k, remaining - 1, self.k_max))

    def _draft(self, r: _Req, k: int) -> list[int]:
        assert self.drafter is not None
        t0 = time.perf_counter()
        try:
            with self._draft_lock:
                (d,) = self.drafter.propose([DraftRequest(r.seq_id, tuple(r.history), k, r.params)])
            V = self.tokenizer.vocab_size
            toks = [int(t) for t in d.token_ids[:k]]
            if any(not 0 <= t < V for t in toks):
                raise ValueError("draft token out of the vocabulary")
        except Exception as e:
            log.warning("drafter failed on request %d (%s: %s); plain decoding from here", r.seq_id, type(e).__name__, e)
            r.drafter_failed = True
            toks = []
        r.stats.draft_time_s += time.perf_counter() - t0
        return toks

    def _round(self, r: _Req, rng: random.Random) -> tuple[list[int], int, int]:
        """Draft, verify with one server request; (emitted tokens, accepted drafts, drafted)."""
        k = self._choose_k(r)
        drafts = self._draft(r, k) if k else []
        ids = r.history + drafts
        approx = r.params.temperature > 0
        drafts = self._canonical_drafts(r.history, drafts)
        ids = r.history + drafts
        try:
            dists = self._server_dists(ids, len(r.history), top_n=APPROX_TOP_N if approx else 1)
        except RetokenizeError:
            if not drafts:
                raise
            drafts, ids = [], list(r.history)  # the drafts did not survive re-tokenization: verify none
            dists = self._server_dists(ids, len(r.history), top_n=APPROX_TOP_N if approx else 1)
        emitted: list[int] = []
        accepted = 0
        for j, x in enumerate(drafts):
            if approx:
                ok, tok = _approx_step(dists[j], x, r.params.temperature, rng)
            else:
                best = self._argmax(dists[j])
                ok, tok = best == x, best
            if not ok:
                emitted.append(tok)
                return emitted, accepted, len(drafts)
            emitted.append(x)
            accepted += 1
        last = dists[len(drafts)]
        emitted.append(_approx_sample(last, r.params.temperature, rng) if approx else self._argmax(last))
        return emitted, accepted, len(drafts)

    def _canonical_drafts(self, history: list[int], drafts: list[int]) -> list[int]:
        """The longest prefix of drafts whose text re-tokenizes to the same ids (checked on a local tail)."""
        if self._bos in drafts:  # the server's lists skip BOS-id tokens: such a draft cannot be verified
            drafts = drafts[: drafts.index(self._bos)]
        if not drafts:
            return drafts
        tail = history[-8:]
        for m in range(len(drafts), 0, -1):
            seq = tail + drafts[:m]
            if self.tokenizer.encode(self.tokenizer.decode(seq, skip_special=False), add_special=False) == seq:
                return drafts[:m]
        return []

    def _argmax(self, dist: dict[int, float]) -> int:
        return max(dist.items(), key=lambda kv: kv[1])[0]

    def pieces(self) -> TokenPieces:
        if self._pieces is None:
            self._pieces = TokenPieces(self.tokenizer)
        return self._pieces

    def _server_dists(self, ids: list[int], start: int, top_n: int) -> list[dict[int, float]]:
        """The server's top-n {id: logprob} for positions start..len(ids) (the last one after all of ids)."""
        pieces = self.pieces()
        body: dict[str, object] = {
            "prompt": self.tokenizer.decode(ids, skip_special=False),
            "max_tokens": 1,
            "echo": True,
            "logprobs": top_n,
            "temperature": 0.0,
        }
        if self.model_name:
            body["model"] = self.model_name
        t0 = time.perf_counter()
        resp = self._http.post(self.url + "/v1/completions", json=body)
        dt = time.perf_counter() - t0
        with self._lock:
            self.rounds += 1
            self.http_s += dt
        if resp.status_code != 200:
            raise VerifyError(f"HTTP {resp.status_code} from {self.url}: {resp.text[:300]}")
        data = resp.json()
        n_prompt = data.get("usage", {}).get("prompt_tokens")
        lp = data["choices"][0].get("logprobs")
        if lp is None:
            raise VerifyError("the server returned no log-probabilities (llama-cpp-python needs --logits_all true)")
        if n_prompt != len(ids):
            raise RetokenizeError(
                f"the server tokenized the text into {n_prompt} tokens, the gateway holds {len(ids)}: "
                "the history does not survive the server's re-tokenization"
            )
        tops, toks = lp["top_logprobs"], lp["tokens"]
        # llama-cpp-python pairs all_tokens[j] with scores[j] (the distribution after ids[j], i.e. the one
        # predicting position j+1), where all_tokens = ids without a leading BOS, then the completion token;
        # pairs whose token is the BOS id are skipped, and the first pair's top_logprobs is None.
        off = 1 if ids and ids[0] == self._bos else 0
        n_after = len(ids) - off  # all_tokens entries that are ours; index n_after is the completion
        entry_of: dict[int, int] = {}  # j (scores row) -> entry index
        e = 0
        for j in range(len(ids)):
            if j < n_after and ids[j + off] == self._bos:
                continue
            entry_of[j] = e
            e += 1
        eog_last = False
        if off and len(tops) == e - 1 == len(toks) and data["choices"][0].get("finish_reason") == "stop":
            # The server's greedy next token is an end-of-generation token: it is not appended, so the
            # pair for the last position is missing (with a leading BOS only). Its argmax is that EOS.
            entry_of.pop(len(ids) - 1, None)
            e -= 1
            eog_last = True
        if len(tops) != e or len(toks) != e:
            raise VerifyError(f"unexpected log-probability layout: {len(tops)} entries, expected {e}")
        for j in range(max(0, start - 1), n_after):  # the echoed tokens we rely on are ours
            en = entry_of.get(j)
            if en is not None and toks[en] != pieces.pieces[ids[j + off]]:
                raise VerifyError(f"the server echoed {toks[en]!r} at {j + off}, the gateway holds {pieces.pieces[ids[j + off]]!r}")
        out: list[dict[int, float]] = []
        for p in range(start, len(ids) + 1):
            if eog_last and p == len(ids):
                if not self.tokenizer.eos_ids:
                    raise VerifyError("the server ended generation but the route's tokenizer has no EOS id")
                out.append({self.tokenizer.eos_ids[0]: 0.0})
                continue
            en = entry_of.get(p - 1)
            top = tops[en] if en is not None else None
            if not top:
                raise VerifyError(f"the server gave no distribution for position {p} (after a BOS or the first token)")
            dist: dict[int, float] = {}
            best = max(top.values())
            for s, v in top.items():
                if top_n == 1 and v < best:
                    continue  # llama-cpp-python adds the echoed token's own entry: not part of the top-1
                try:
                    dist[pieces.to_id(s)] = float(v)
                except VerifyError:
                    if top_n == 1:
                        raise
            out.append(dist)
        return out

    def _end(self, r: _Req, tokens: list[int], reason: str, error: str | None = None) -> None:
        text = r.detok.delta(self.tokenizer.decode, tokens, final=True) if reason != "error" else ""
        self._deliver(r, Chunk(tokens, text, reason, error=error, stats=r.stats, prompt_tokens=len(r.prompt)))

    def _deliver(self, r: _Req, c: Chunk) -> None:
        try:
            r.sink(c)
        except Exception as e:
            log.warning("request %d: the sink failed: %s: %s", r.seq_id, type(e).__name__, e)


def _softmax_top(dist: dict[int, float], temperature: float) -> dict[int, float]:
    import math

    m = max(dist.values())
    w = {t: math.exp((v - m) / temperature) for t, v in dist.items()}
    z = sum(w.values())
    return {t: x / z for t, x in w.items()}


def _approx_sample(dist: dict[int, float], temperature: float, rng: random.Random) -> int:
    p = _softmax_top(dist, temperature)
    u, acc = rng.random(), 0.0
    for t, x in p.items():
        acc += x
        if u < acc:
            return t
    return next(reversed(p))


def _approx_step(dist: dict[int, float], x: int, temperature: float, rng: random.Random) -> tuple[bool, int]:
    """APPROXIMATE: accept x with p_top-n(x), else sample the top-n residual (one-hot q)."""
    p = _softmax_top(dist, temperature)
    px = p.get(x, 0.0)
    if rng.random() < px:
        return True, x
    rest = {t: v for t, v in p.items() if t != x}
    if not rest:
        return True, x
    z = sum(rest.values())
    u, acc = rng.random() * z, 0.0
    for t, v in rest.items():
        acc += v
        if u < acc:
            return False, t
    return False, next(reversed(rest))
