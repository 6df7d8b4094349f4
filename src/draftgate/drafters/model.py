"""Model drafters: a small Llama-family model on our runner, or the target's GGUF in llama.cpp.

Both keep their own KV per sequence and roll it back in step with the target:
before drafting, the KV is truncated to the longest common prefix of what it
holds and the sequence's current history, and the missing tokens are fed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from draftgate.drafters.base import Draft, DraftRequest
from draftgate.models.runner import ForwardItem, ModelRunner
from draftgate.sampling import logits_to_probs, sample_from_probs

__all__ = ["ModelDrafter", "LlamaCppDrafter", "common_prefix"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ModelDrafter:
    """Drafts k tokens autoregressively with a draft model (greedy: one-hot q; sampled: dense q).

    All sequences of a round advance together: one ragged draft forward per draft position.
    """

    def __init__(self, runner: ModelRunner, name: str = "model", seed: int = 0) -> None:
        self.name = name
        self._runner = runner
        self._fed: dict[int, list[int]] = {}  # tokens whose KV the draft runner holds, per sequence
        self._gen = torch.Generator().manual_seed(seed)

    def _sync(self, reqs: Sequence[DraftRequest]) -> list[torch.Tensor]:
        """Bring each sequence's draft KV to its history; return next-token logits [V] per request."""
        items = []
        for r in reqs:
            hist = list(r.tokens)
            fed = self._fed.get(r.seq_id)
            if fed is None:
                cached = self._runner.add_sequence(r.seq_id, hist)
                fed = hist[:cached]
            n = min(common_prefix(fed, hist), len(hist) - 1)  # always feed >= 1 token for logits
            self._runner.truncate(r.seq_id, n)
            items.append(ForwardItem(r.seq_id, hist[n:], 1))
            self._fed[r.seq_id] = hist
        return [lg[-1] for lg in self._runner.forward(items)]

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        active = [r for r in requests if r.k > 0 and len(r.tokens) > 0]
        if not active:
            return [Draft([]) for _ in requests]
        logits = self._sync(active)
        toks: dict[int, list[int]] = {r.seq_id: [] for r in active}
        qs: dict[int, list[torch.Tensor]] = {r.seq_id: [] for r in active}
        live = list(range(len(active)))
        for _ in range(max(r.k for r in active)):
            for i, lg in zip(live, logits, strict=True):
                r = active[i]
                p = r.params
                if p.greedy:
                    t = int(lg.argmax())
                else:
                    q = logits_to_probs(lg[None], p.temperature, p.top_k, p.top_p)  # [1, V]
                    u = torch.rand(1, generator=self._gen, dtype=torch.float64)
                    t = int(sample_from_probs(q, u)[0])
                    qs[r.seq_id].append(q[0])
                toks[r.seq_id].append(t)
            live = [i for i in live if len(toks[active[i].seq_id]) < active[i].k]
            if not live:
                break
            items = [ForwardItem(active[i].seq_id, [toks[active[i].seq_id][-1]], 1) for i in live]
            logits = [lg[-1] for lg in self._runner.forward(items)]
            for i in live:
                self._fed[active[i].seq_id].append(toks[active[i].seq_id][-1])
        out = {r.seq_id: Draft(toks[r.seq_id], torch.stack(qs[r.seq_id]) if qs[r.seq_id] else None) for r in active}
        return [out.get(r.seq_id, Draft([])) for r in requests]

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        pass  # the next propose() rolls the KV back to the common prefix

    def release(self, seq_id: int) -> None:
        if self._fed.pop(seq_id, None) is not None:
            self._runner.free(seq_id)


class LlamaCppDrafter:
    """The target's own quantized GGUF weights run by llama.cpp as a greedy draft (one-hot q).

    llama.cpp's Q4 kernels cost ~0.16 of a torch fp32 target step here and agree with
    the fp32 target on 96-99% of greedy tokens. One llama.cpp context per sequence,
    up to ``max_seqs``; sequences beyond that get no drafts (plain decoding).
    """

    def __init__(self, gguf_path: str, n_ctx: int = 4096, max_seqs: int = 4, n_threads: int | None = None) -> None:
        try:
            import llama_cpp  # noqa: F401
        except ImportError as e:
            raise ImportError(
                "drafter 'quant' needs llama-cpp-python: `make llamacpp` (builds it, ~11 min on 2 cores)"
            ) from e
        self.name = "quant"
        self._path = gguf_path
        self._n_ctx = n_ctx
        self._n_threads = n_threads or torch.get_num_threads()
        self._free: list[Any] = []
        self._ctx: dict[int, Any] = {}
        self._max = max_seqs

    def _get(self, seq_id: int) -> Any | None:
        if seq_id in self._ctx:
            return self._ctx[seq_id]
        if len(self._ctx) >= self._max:
            return None
        if self._free:
            llm = self._free.pop()
        else:
            from llama_cpp import Llama

            llm = Llama(self._path, n_ctx=self._n_ctx, n_threads=self._n_threads, verbose=False)
        llm.n_tokens = 0
        self._ctx[seq_id] = llm
        return llm

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        out = []
        for r in requests:
            llm = self._get(r.seq_id) if r.k > 0 else None
            if llm is None or len(r.tokens) + r.k >= self._n_ctx:
                out.append(Draft([]))
                continue
            hist = list(r.tokens)
            held = list(llm.input_ids[: llm.n_tokens])
            n = min(common_prefix(held, hist), len(hist) - 1)
            llm.n_tokens = n
            llm.eval(hist[n:])
            toks: list[int] = []
            for i in range(r.k):
                t = int(self._last_logits(llm).argmax())
                toks.append(t)
                if i < r.k - 1:
                    llm.eval([t])
            out.append(Draft(toks))
        return out

    @staticmethod
    def _last_logits(llm: Any) -> Any:
        """Logits [V] of the last evaluated token (llama-cpp-python keeps no copy without logits_all)."""
        import numpy as np

        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        pass

    def release(self, seq_id: int) -> None:
        llm = self._ctx.pop(seq_id, None)
        if llm is not None:
            self._free.append(llm)
