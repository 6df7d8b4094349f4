"""OpenAITarget: the round target on an OpenAI-compatible completion server we do not own.

The request loop is the engine's (``openai_engine.OpenAITargetEngine`` = ``Engine`` over this target, any
local drafter: n-gram, suffix, auto...); each round verifies a sequence's drafts with ONE
request to the server:

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
  back to ids through the route's tokenizer (the same GGUF). A string several ids
  share (every special token and byte fragment prints as "", ' ' stands for 38
  ids) is never resolved by guessing: a round ends just before a position whose
  server choice is such a string, and a request whose very next token is one ends
  with a clear error (exact or a clear failure, never a silent drift).

Verification is the engine's own (``verify.verify_round``) on logits rebuilt from the server's
top-n log-probabilities (-inf outside them): exact for greedy. Sampling (temperature > 0) is
refused at submit time (HTTP 400) unless the route sets ``allow_approximate``: the top-n do
not carry the full distribution, so p is the request's temperature/top-k/top-p applied to the
top-n only -- an approximation, reported as ``approximate`` on the request's stats and counted
in ``approximate_requests``.

Cost note (informal, llama-cpp-python 0.3.x): its echo+logprobs path sorts
the full vocabulary in Python for every prompt position of every request, so a
round costs O(history x V log V) on the server; long histories make this back
end slow there. Servers with proper prompt_logprobs (vLLM) do not have that cost
but are not handled by this module's layout checks yet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import httpx
import torch

from draftgate.engine import TargetInfo, check_prompt
from draftgate.errors import BadRequestError
from draftgate.models.tokenizer import TextTokenizer
from draftgate.types import SamplingParams

__all__ = ["OpenAIScorer", "TokenPieces", "VerifyError"]

log = logging.getLogger("draftgate.openai_target")
APPROX_TOP_N = 10


class VerifyError(RuntimeError):
    """The server's answer cannot be read exactly (layout, re-tokenization, ambiguous strings)."""


class AmbiguousToken(VerifyError):
    """The server's token prints like several ids of the route's tokenizer: which one it chose is unknown."""

    def __init__(self, piece: str, n: int) -> None:
        super().__init__(f"the server's token {piece!r} prints like {n} ids of the route's tokenizer")
        self.piece = piece


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
        special = tokenizer.special_ids()
        self.pieces: list[str] = []
        self.by_piece: dict[str, list[int]] = {}
        for i in range(tokenizer.vocab_size):
            tok = tokenizer.id_to_token(i)
            if tok is None or i in special:
                s = ""
            elif all(ch in inv for ch in tok):
                s = bytes(inv[ch] for ch in tok).decode("utf-8", errors="ignore")
            else:
                s = tokenizer.decode([i], skip_special=False)
            self.pieces.append(s)
            self.by_piece.setdefault(s, []).append(i)

    def to_id(self, s: str) -> int:
        """The one id that prints as ``s``; AmbiguousToken if several do (never a guess among them).

        In llama.cpp's output every special token and every incomplete UTF-8 byte token prints as
        "" (291 ids of SmolLM2), and ' ' stands for 38: reading "" as EOS ended text with emoji or
        CJK early, and picking one of several ids let the history drift from the server's.
        """
        ids = self.by_piece.get(s, [])
        if len(ids) == 1:
            return ids[0]
        if not ids:
            raise VerifyError(f"the server's token {s!r} is not in the route's tokenizer")
        raise AmbiguousToken(s, len(ids))


class OpenAIScorer:
    """Scorer (``engine.ScoredTarget``) for gateway routes with ``target: openai+http://HOST:PORT``."""

    def __init__(
        self,
        url: str,
        tokenizer: TextTokenizer,
        allow_approximate: bool = False,
        timeout_s: float = 60.0,
        model_name: str | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.tokenizer = tokenizer
        self.allow_approximate = allow_approximate
        self.model_name = model_name
        self.info = TargetInfo("openai", tokenizer.vocab_size, None, exact_sampling=False)
        self.rounds = 0
        self.http_s = 0.0  # time spent waiting for the server (all rounds)
        self._own_client = client is None
        self._timeout_s = timeout_s
        self._http = client or httpx.Client(timeout=timeout_s)
        self._pieces: TokenPieces | None = None
        self._bos = tokenizer.bos_id
        self._lock = threading.Lock()

    def check(self, prompt_ids: Sequence[int], params: SamplingParams, k_max: int) -> None:
        """The refusal: sampling on this back end is only served when the route allows approximation."""
        if params.temperature > 0 and not self.allow_approximate:
            raise BadRequestError(
                "this model's target is an OpenAI-compatible server verified through its prompt log-probabilities, "
                "which is exact only for greedy decoding: send temperature 0, or ask the operator to enable "
                "approximate mode (allow_approximate) for this route"
            )
        check_prompt(prompt_ids, params.max_new_tokens, self.tokenizer.vocab_size, None)

    def score(
        self, history: Sequence[int], drafts: Sequence[int], params: SamplingParams
    ) -> tuple[list[int], torch.Tensor]:
        """One server request: the server's top-n at each draft position and after, as logits (-inf elsewhere)."""
        history = list(history)
        top_n = APPROX_TOP_N if params.temperature > 0 else 1
        kept = self._canonical_drafts(history, list(drafts))
        try:
            dists = self._server_dists(history + kept, len(history), top_n=top_n)
        except (RetokenizeError, AmbiguousToken):
            if not kept:
                raise
            # The drafts did not survive re-tokenization, or the server's next token is ambiguous
            # in the middle of the echo: ask for it as the completion, where an EOS shows as one.
            kept = []
            dists = self._server_dists(history, len(history), top_n=top_n)
        kept = kept[: len(dists) - 1]  # an ambiguous position ends the round just before it
        logits = torch.full((len(dists), self.tokenizer.vocab_size), float("-inf"))  # [k+1, V]
        for row, dist in enumerate(dists):
            for tok, lp in dist.items():
                logits[row, tok] = lp
        return kept, logits

    def shutdown(self) -> None:
        if self._own_client:
            self._http.close()
            self._http = httpx.Client(timeout=self._timeout_s)  # restartable

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
                raise VerifyError(
                    f"the server echoed {toks[en]!r} at {j + off}, the gateway holds {pieces.pieces[ids[j + off]]!r}"
                )
        out: list[dict[int, float]] = []
        # The completion (max_tokens 1) stopped: the server's choice after all of ids was an end of
        # generation, whatever string its distribution shows for it.
        stopped = data["choices"][0].get("finish_reason") == "stop" and not data["choices"][0].get("text")
        for p in range(start, len(ids) + 1):
            if (eog_last or stopped) and p == len(ids):
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
            try:
                for s, v in sorted(top.items(), key=lambda kv: -kv[1]):
                    if top_n == 1 and v < best:
                        continue  # llama-cpp-python adds the echoed token's own entry: not part of the top-1
                    try:
                        dist[pieces.to_id(s)] = float(v)
                    except AmbiguousToken:
                        if v == best:
                            raise  # the server's own choice here cannot be identified
                        # a lower alternative (approximate mode only): it cannot be placed, drop it
            except AmbiguousToken:
                if not out:
                    raise  # the server's very next token cannot be identified: stop rather than guess
                return out  # the round ends before this position (the scorer verifies what precedes it)
            out.append(dist)
        return out
