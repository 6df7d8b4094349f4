"""Model drafters: a small Llama-family model on our runner (``model``), or the target's own quantized
copy on the same kernels (``quant``).

The drafter keeps its own KV per sequence and rolls it back in step with the target:
before drafting, the KV is truncated to the longest common prefix of what it
holds and the sequence's current history, and the missing tokens are fed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from draftgate.drafters.base import Abilities, Draft, DraftRequest, SparseQ
from draftgate.models.runner import ForwardItem, ModelRunner
from draftgate.sampling import logits_to_probs, sample_from_probs

__all__ = ["ModelDrafter", "common_prefix", "derive_seed"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def derive_seed(seed: int, salt: str) -> int:
    """A draft's own random stream from the request's seed: reproducible, never the target's."""
    return int.from_bytes(hashlib.sha256(f"draftgate-draft:{seed}:{salt}".encode()).digest()[:8], "little") >> 2


class ModelDrafter:
    """Drafts k tokens autoregressively with a draft model (greedy: one-hot q; sampled: exact q).

    All sequences of a round advance together: one ragged draft forward per draft position.
    A sampled draft is drawn from q after the request's transforms (temperature, top-k, top-p),
    dense ``[k, V]``, or with ``q_top_n`` cut to its most likely ids and renormalized (sparse:
    what a remote draft worker sends); either way the token is drawn from exactly the q returned.
    Each sequence draws from its own generator, seeded from the request's seed, so the same
    seeded request gives the same drafts (and tokens) every time.
    """

    sampled_q = True
    abilities = Abilities()  # none beyond the protocol

    def __init__(
        self, runner: ModelRunner, name: str = "model", q_top_n: int | None = None, one_hot: bool = False
    ) -> None:
        """``one_hot``: draft q's most likely token under sampling too (no q: verified by matching the target's
        own position-keyed choice), so a seeded request's tokens never depend on which rounds were drafted."""
        if q_top_n is not None and q_top_n < 1:
            raise ValueError(f"q_top_n must be >= 1, got {q_top_n}")
        self.name = name
        self.one_hot = one_hot
        self.sampled_q = not one_hot
        self.q_top_n = q_top_n
        self._runner = runner
        self._fed: dict[int, list[int]] = {}  # tokens whose KV the draft runner holds, per sequence
        self._gens: dict[int, torch.Generator] = {}  # per sequence, from its request's seed

    def _sync(self, reqs: Sequence[DraftRequest]) -> list[torch.Tensor]:
        """Bring each sequence's draft KV to its history; return next-token logits [V] per request."""
        items = []
        for r in reqs:
            hist = list(r.tokens)
            fed = self._fed.pop(r.seq_id, None)  # unknown until the forward succeeds
            if fed is None:
                cached = self._runner.add_sequence(r.seq_id, hist) if not self._runner.kv.has(r.seq_id) else 0
                fed = hist[:cached]
            n = min(common_prefix(fed, hist), len(hist) - 1)  # always feed >= 1 token for logits
            self._runner.truncate(r.seq_id, n)
            items.append(ForwardItem(r.seq_id, hist[n:], 1))
        logits = [lg[-1] for lg in self._runner.forward(items)]
        for r in reqs:
            self._fed[r.seq_id] = list(r.tokens)
        return logits

    def _gen(self, r: DraftRequest) -> torch.Generator:
        g = self._gens.get(r.seq_id)
        if g is None:
            seed = r.params.seed if r.params.seed is not None else int(torch.randint(0, 2**62, (1,)))
            g = self._gens[r.seq_id] = torch.Generator().manual_seed(derive_seed(seed, "model"))
        return g

    def _sample(
        self, lg: torch.Tensor, r: DraftRequest
    ) -> tuple[int, torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
        """A token drawn from q (after the request's transforms) and that q: dense [V] or sparse ([M], [M])."""
        p = r.params
        q = logits_to_probs(lg[None], p.temperature, p.top_k, p.top_p)[0]  # [V]
        u = torch.rand(1, generator=self._gen(r), dtype=torch.float64)
        if self.q_top_n is None:
            return int(sample_from_probs(q[None], u)[0]), q
        probs, ids = q.topk(min(self.q_top_n, q.shape[0]))  # [M], best first
        keep = probs > 0
        probs, ids = probs[keep], ids[keep]
        probs = probs / probs.sum()
        return int(ids[sample_from_probs(probs[None], u)[0]]), (ids, probs)

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        active = [r for r in requests if r.k > 0 and len(r.tokens) > 0]
        if not active:
            return [Draft([]) for _ in requests]
        try:
            logits = self._sync(active)
            toks: dict[int, list[int]] = {r.seq_id: [] for r in active}
            qs: dict[int, list] = {r.seq_id: [] for r in active}  # type: ignore[type-arg]
            live = list(range(len(active)))
            for _ in range(max(r.k for r in active)):
                for i, lg in zip(live, logits, strict=True):
                    r = active[i]
                    if r.params.greedy or self.one_hot:
                        t = int(lg.argmax())
                    else:
                        t, q = self._sample(lg, r)
                        qs[r.seq_id].append(q)
                    toks[r.seq_id].append(t)
                live = [i for i in live if len(toks[active[i].seq_id]) < active[i].k]
                if not live:
                    break
                items = [ForwardItem(active[i].seq_id, [toks[active[i].seq_id][-1]], 1) for i in live]
                logits = [lg[-1] for lg in self._runner.forward(items)]
                for i in live:
                    self._fed[active[i].seq_id].append(toks[active[i].seq_id][-1])
        except BaseException:
            for r in active:  # their KV state is unknown now: start again next time
                self._drop(r.seq_id)
            raise
        out = {r.seq_id: Draft(toks[r.seq_id], _stack_q(qs[r.seq_id])) for r in active}
        return [out.get(r.seq_id, Draft([])) for r in requests]

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        pass  # the next propose() rolls the KV back to the common prefix

    def release(self, seq_id: int) -> None:
        self._gens.pop(seq_id, None)
        self._drop(seq_id)

    def _drop(self, seq_id: int) -> None:
        self._fed.pop(seq_id, None)
        self._runner.free(seq_id)


def _stack_q(qs: list) -> torch.Tensor | SparseQ | None:  # type: ignore[type-arg]
    """The per-token q of a draft: None (greedy), dense [k, V], or sparse padded to the widest row."""
    if not qs:
        return None
    if isinstance(qs[0], torch.Tensor):
        return torch.stack(qs)  # [k, V]
    M = max(ids.shape[0] for ids, _ in qs)
    ids_t = torch.zeros(len(qs), M, dtype=torch.int64)  # [k, M]; padding: id 0 with probability 0
    probs_t = torch.zeros(len(qs), M, dtype=torch.float32)  # [k, M]
    for i, (ids, probs) in enumerate(qs):
        ids_t[i, : ids.shape[0]] = ids
        probs_t[i, : probs.shape[0]] = probs
    return SparseQ(ids_t, probs_t)
