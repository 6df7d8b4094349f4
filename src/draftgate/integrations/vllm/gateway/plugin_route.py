"""A route whose target is a vLLM server running DraftGate's proposer (``vllm+http://HOST:PORT``).

vLLM drafts (with DraftGate's proposer, loaded by ``--speculative-config '{"method":
"custom_class", "model": "draftgate.integrations.vllm.Proposer", ...}'``), verifies in its own
scheduler and rejection sampler, and streams the result; the gateway owns the operations:

* each request goes to ``POST /v1/completions`` with the gateway's prompt token ids and
  ``vllm_xargs`` that the proposer reads per request: ``draftgate_speculate`` (the route's
  switch, the admin kill switch, the canary's plain arm), ``draftgate_drafter`` (the route's
  drafter: ``auto``, ``suffix``, ``ngram``, or ``remote`` for an ``http://`` draft worker, which
  vLLM's proposer reaches through its own ``DRAFTGATE_VLLM_DRAFT_URL``) and ``draftgate_k`` (a
  fixed K); switching needs no restart of vLLM;
* the response is rebuilt from vLLM's token ids with the gateway's tokenizer, so stop strings,
  text and the stream are the gateway's as on every other route;
* while speculation is off, shadow replays use a local drafter of the route's kind.

Output is vLLM's own by construction: greedy token for token, sampled in distribution (vLLM
verifies one-hot drafts with its rejection sampler; DraftGate's plugin repairs the CPU build's
sampling-parameter expansion that breaks this on vLLM 0.32: docs/VLLM.md).

At start it checks the server: it answers, serves one model whose tokenizer gives the route's
token ids, and reports speculative-decoding metrics (a vLLM without a proposer still serves,
with a warning naming the missing flag).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import httpx

from draftgate.drafters.base import Drafter
from draftgate.engine import Backend, Chunk, IncrementalText, Sink, StopChecker, check_prompt
from draftgate.errors import CapacityError
from draftgate.integrations.vllm.contract import DRAFTER, SPECULATE, DrafterName, K
from draftgate.integrations.vllm.gateway.checks import ServerFacts, VllmTargetError, connect
from draftgate.integrations.vllm.gateway.wire import error_message
from draftgate.models.tokenizer import TextTokenizer
from draftgate.types import SamplingParams, SpecStats

__all__ = ["VllmPluginBackend", "VllmTargetError", "PROPOSER_DRAFTERS"]

log = logging.getLogger("draftgate.vllm_target")

PROPOSER_DRAFTERS = tuple(d.value for d in DrafterName)  # what DraftGate's proposer in vLLM drafts with


class VllmPluginBackend(Backend):
    """The back end of a ``vllm+http://`` route: requests stream from vLLM, speculation switched per request."""

    def __init__(
        self,
        url: str,
        tokenizer: TextTokenizer,
        drafter: Drafter | None,
        proposer_drafter: str | None,
        k: int | None = None,
        k_max: int = 8,
        max_queue: int = 256,
        timeout_s: float = 600.0,
        client: httpx.Client | None = None,
        facts: ServerFacts | None = None,
        passthrough: bool = False,
    ) -> None:
        """``passthrough``: the relay of a rounds route (``engine.VllmTargetEngine``): every request is
        vLLM's own decoding, reported as ``target_decoded``."""
        if proposer_drafter is not None and proposer_drafter not in PROPOSER_DRAFTERS:
            raise ValueError(
                f"a vllm+http:// route drafts with DraftGate's proposer inside vLLM: drafter must be one of "
                f"{', '.join(PROPOSER_DRAFTERS[:3])} or an http:// draft worker, got {proposer_drafter!r}"
            )
        self.url = url.rstrip("/")
        self.tokenizer = tokenizer
        self._drafter = drafter  # local, for shadow replays; None: the route never speculates
        self.proposer_drafter = proposer_drafter
        self.passthrough = passthrough
        self.k, self.k_max = k, k_max
        self.max_queue = max_queue
        self.speculation_enabled = drafter is not None
        self.cost = None  # vLLM runs the forwards: nothing measured here (shadow predictions use prior units)
        self._client = client or httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10.0))
        self._lock = threading.Lock()
        self._running = 0
        self.model_name, self.max_context, self.has_spec_metrics = self._connect(facts)

    # ---------------------------------------------------------------- start-up checks

    def _connect(self, facts: ServerFacts | None) -> tuple[str, int | None, bool]:
        """The server's facts (``facts``: already checked by the caller, else checked here)."""
        facts = facts or connect(self.url, self._client, self.tokenizer)
        if not facts.proposer and self._drafter is not None:
            log.warning(
                "vLLM at %s runs without speculative decoding: requests are served, nothing is drafted. Start it with "
                '--speculative-config \'{"method": "custom_class", "model": "draftgate.integrations.vllm.Proposer", '
                "\"num_speculative_tokens\": 8}' (pip install 'draftgate[vllm]' in vLLM's environment), or with "
                "--enable-scale-out for the gateway's own rounds",
                self.url,
            )
        return facts.model, facts.max_context, facts.proposer

    # ---------------------------------------------------------------- the back end

    @property
    def drafter(self) -> Drafter | None:
        return self._drafter

    @property
    def num_running(self) -> int:
        return self._running

    @property
    def num_waiting(self) -> int:
        return 0  # vLLM queues; the gateway holds nothing back

    def shutdown(self) -> None:
        self._client.close()

    def kv_stats(self) -> dict[str, int]:
        return {}  # vLLM's KV cache: see its /metrics

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, sink: Sink, speculate: bool = True
    ) -> Callable[[], None]:
        params.validate()
        check_prompt(prompt_ids, params.max_new_tokens, self.tokenizer.vocab_size, self.max_context)
        with self._lock:
            if self._running >= self.max_queue:
                raise CapacityError(f"{self._running} requests in flight (max {self.max_queue}); retry shortly")
            self._running += 1
        stop = threading.Event()
        body = self._body(prompt_ids, params, speculate)
        threading.Thread(target=self._run, args=(body, params, sink, stop), daemon=True, name="vllm-request").start()
        return stop.set

    def _body(self, prompt_ids: list[int], params: SamplingParams, speculate: bool) -> dict[str, Any]:
        on = speculate and self.speculation_enabled
        xargs: dict[str, Any] = {SPECULATE: int(on)}
        if on and self.proposer_drafter is not None:
            xargs[DRAFTER] = self.proposer_drafter
        if on and self.k is not None:
            xargs[K] = self.k
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": prompt_ids,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "ignore_eos": params.ignore_eos,
            "stream": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "vllm_xargs": xargs,
        }
        if params.top_k:
            body["top_k"] = params.top_k
        if params.seed is not None:
            body["seed"] = params.seed
        if params.cache_salt is not None:
            body["cache_salt"] = params.cache_salt
        return body

    def _stats(self, body: dict[str, Any]) -> SpecStats:
        """The drafter the request ran with; vLLM reports no per-request counts (see its /metrics)."""
        on = body["vllm_xargs"][SPECULATE] and self.proposer_drafter is not None
        return SpecStats(drafter=self.proposer_drafter if on else "none", target_decoded=self.passthrough)  # type: ignore[arg-type]

    def _run(self, body: dict[str, Any], params: SamplingParams, sink: Sink, stop: threading.Event) -> None:
        text = IncrementalText(StopChecker(self.tokenizer, params))
        out: list[int] = []

        def emit(ids: list[int], reason: str | None) -> None:
            sink(
                Chunk(
                    ids,
                    text.delta(self.tokenizer.decode, ids, reason is not None),
                    reason,
                    None,
                    self._stats(body) if reason else None,
                    len(body["prompt"]),
                )
            )

        try:
            with self._client.stream("POST", self.url + "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    r.read()
                    raise VllmTargetError(f"vLLM answered HTTP {r.status_code}: {error_message(r.text)}")
                for line in r.iter_lines():
                    if stop.is_set():
                        return
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    obj = json.loads(line[len("data: ") :])
                    if "error" in obj:
                        raise VllmTargetError(f"vLLM failed the request: {error_message(json.dumps(obj))}")
                    choice = obj["choices"][0]
                    ids = [int(t) for t in choice.get("token_ids") or []]
                    keep, reason = text.checker.cut(out, ids)
                    out.extend(ids[:keep])
                    reason = reason or _finish(choice.get("finish_reason"))
                    if ids[:keep] or reason:
                        emit(ids[:keep], reason)
                    if reason:
                        return
            raise VllmTargetError("vLLM ended the stream without a finish reason")
        except (httpx.HTTPError, VllmTargetError, ValueError, KeyError) as e:
            if not stop.is_set():
                msg = str(e) if isinstance(e, VllmTargetError) else f"vLLM at {self.url} failed mid-request: {e!r}"
                log.warning("%s", msg)
                sink(Chunk([], "", "error", msg, None, len(body["prompt"])))
        finally:
            with self._lock:
                self._running -= 1


def _finish(reason: object) -> str | None:
    if reason is None:
        return None
    return "length" if reason == "length" else "stop"
