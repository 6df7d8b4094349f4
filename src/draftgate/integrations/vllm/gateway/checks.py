"""Start-up checks of a vLLM server behind a ``vllm+http://`` route, and which mode the route runs in.

``connect`` checks what every vLLM route needs (it answers, serves one model, tokenizes exactly
as the route's tokenizer) and reads what decides the mode: a server running DraftGate's proposer
(speculative-decoding metrics) drafts and verifies itself (``plugin_route``); one started with
``--enable-scale-out`` serves the token route the gateway's rounds score through
(``target``). ``check_rows`` proves, once, that the server reports rows inside its prefix
cache in a way the rounds can tell apart from computed ones; ``check_numerics`` measures how far a
scoring pass and vLLM's decode steps disagree on this server, which sets the margin a scored
argmax needs to count as vLLM's choice.

vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``) would make the two agree bitwise, but in
the releases this was checked against it changes kernels on CUDA (and XPU) only; the measured margin
covers any server, invariant or not.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass

import httpx

from draftgate.errors import DraftGateError
from draftgate.integrations.vllm.gateway.target import MIN_MARGIN
from draftgate.integrations.vllm.gateway.wire import GENERATE, GarbageRow, RowError, VllmWire, WireError, read_row
from draftgate.models.tokenizer import TextTokenizer

__all__ = ["ServerFacts", "VllmTargetError", "connect", "check_rows", "check_numerics", "SPEC_METRIC", "PROBE"]

log = logging.getLogger("draftgate.vllm_checks")

SPEC_METRIC = "vllm:spec_decode_num_draft_tokens_total"
NUMERICS_TOKENS = 32  # decode steps the numerics check compares with one scoring pass
MARGIN_FACTOR = 20.0  # the margin: this many times the largest difference seen
PROBE = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Grüße, 世界! def f(x): return x**2"},
]


class VllmTargetError(DraftGateError, RuntimeError):
    """The vLLM server cannot serve this route (unreachable, wrong model or tokenizer, a missing flag)."""


@dataclass(frozen=True)
class ServerFacts:
    model: str  # the one model it serves
    max_context: int | None  # its max_model_len
    proposer: bool  # it reports speculative-decoding metrics (DraftGate's proposer, or another)
    token_route: bool  # POST /inference/v1/generate exists (--enable-scale-out)


def _get(client: httpx.Client, url: str, path: str) -> httpx.Response:
    try:
        r = client.get(url + path, timeout=10.0)
    except httpx.HTTPError as e:
        raise VllmTargetError(f"no vLLM answers at {url} ({e}); start it or fix --target") from None
    if r.status_code != 200:
        raise VllmTargetError(f"{url}{path} answered HTTP {r.status_code}: is this a vLLM server?")
    return r


def connect(url: str, client: httpx.Client, tokenizer: TextTokenizer) -> ServerFacts:
    """Check the server serves the route's model; what it offers. VllmTargetError says what to fix."""
    _get(client, url, "/health")
    models = _get(client, url, "/v1/models").json().get("data") or []
    if len(models) != 1:
        raise VllmTargetError(f"vLLM at {url} serves {len(models)} models; a route needs a server with one")
    name, max_len = str(models[0]["id"]), models[0].get("max_model_len")
    ours = tokenizer.encode_chat(PROBE)
    text = tokenizer.decode(ours, skip_special=False)
    r = client.post(url + "/tokenize", json={"model": name, "prompt": text, "add_special_tokens": False})
    theirs = r.json().get("tokens") if r.status_code == 200 else None
    if theirs != ours:
        raise VllmTargetError(
            f"vLLM at {url} ({name}) tokenizes differently from the route's model: the route must name "
            "the model vLLM serves (the same tokenizer)"
        )
    proposer = SPEC_METRIC in _get(client, url, "/metrics").text
    # Without --enable-scale-out vLLM answers the token route 403 (or 404 where it predates it).
    one = {"model": name, "token_ids": ours[:4], "sampling_params": {"max_tokens": 1, "detokenize": False}}
    route = client.post(url + GENERATE, json=one, timeout=60.0).status_code == 200
    return ServerFacts(name, int(max_len) if max_len else None, proposer, route)


def check_rows(wire: VllmWire, tokenizer: TextTokenizer) -> None:
    """Refuse a server whose cached rows could pass for computed ones (garbage without the zero-fill fix).

    A prompt longer than one KV block is scored twice under a fresh salt (the second time its
    first block is cached), then once more under another salt (all computed): a row inside the
    cache must be reported as not computed (zero-filled, or below the cached count vLLM states),
    or equal the computed one (prefix caching off).
    """
    ids = (tokenizer.encode_chat(PROBE) * 8)[:80]
    salt, fresh = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    try:
        wire.score(ids[:70], salt)
        cached = wire.score(ids, salt)
        computed = wire.score(ids, fresh)
    except (WireError, httpx.HTTPError) as e:
        raise VllmTargetError(
            f"vLLM at {wire.url} refused a scoring request ({e}); the gateway's rounds need prompt log-probabilities "
            "(--max-logprobs >= 1) and cache salts"
        ) from None
    try:
        row = read_row(cached, ids, 1)
    except GarbageRow:
        row = None  # a cached row handed out as garbage
    except RowError:
        return  # reported as not computed: the rounds can tell
    if row is None or row != read_row(computed, ids, 1):
        raise VllmTargetError(
            f"vLLM at {wire.url} hands out prompt log-probability rows inside its prefix cache uninitialised: "
            "install DraftGate in vLLM's environment (pip install 'draftgate[vllm]': its plugin zero-fills them) "
            "or start vLLM with --enable-prompt-tokens-details"
        )
    log.warning(
        "vLLM at %s recomputes every prompt (prefix caching off?): each round re-prefills its history; "
        "start it with --enable-prefix-caching",
        wire.url,
    )


def check_numerics(wire: VllmWire, tokenizer: TextTokenizer) -> float:
    """The margin for this server: MARGIN_FACTOR times the largest difference between a decode step's
    log-probability of its token and a scoring pass's of the same token, at least MIN_MARGIN.

    vLLM decodes NUMERICS_TOKENS greedy tokens after the probe prompt (reporting each one's
    log-probability), then one scoring request under a fresh cache salt reads the same positions.
    A decode step whose argmax the scoring pass does not share refuses the server: the rounds would
    verify against a different model than the one that decodes."""
    ids = tokenizer.encode_chat(PROBE)
    sp = {"max_tokens": NUMERICS_TOKENS, "temperature": 0.0, "logprobs": 1, "ignore_eos": True, "detokenize": False}
    try:
        r = wire.client.post(
            wire.url, json={"model": wire.model, "token_ids": ids, "sampling_params": sp}, timeout=60.0
        )
        if r.status_code != 200:
            raise WireError(f"HTTP {r.status_code}")
        choice = r.json()["choices"][0]
        out = [int(t) for t in choice["token_ids"]]
        decoded = [float(c["logprob"]) for c in choice["logprobs"]["content"]]
        scored = wire.score(ids + out, secrets.token_urlsafe(16), from_row=len(ids), timeout_s=60.0)
    except (WireError, httpx.HTTPError, KeyError, TypeError, ValueError) as e:
        raise VllmTargetError(
            f"vLLM at {wire.url} refused the numerics check ({e}); the gateway's rounds need log-probabilities "
            "(--max-logprobs >= 2)"
        ) from None
    worst = 0.0
    for j, (tok, lp) in enumerate(zip(out, decoded, strict=True)):
        try:
            row = read_row(scored, ids + out, len(ids) + j)
        except RowError:
            continue
        entry = row.get(tok)
        if entry is None or (entry[1] != 1 and entry[0] < max(v for v, _ in row.values())):
            raise VllmTargetError(
                f"vLLM at {wire.url} decodes token {tok} where its own scoring pass ranks another first: the "
                "rounds cannot verify against this server"
            )
        worst = max(worst, abs(entry[0] - lp))
    m = max(MIN_MARGIN, MARGIN_FACTOR * worst)
    log.info(
        "vLLM at %s: a scoring pass and decode steps differ by up to %.2g in log-probability; near-tie margin %.3g",
        wire.url,
        worst,
        m,
    )
    return m
