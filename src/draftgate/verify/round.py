"""Verify one round for the whole batch in one call: every sequence's drafts against its target rows.

The target's logits come flat, ``[R, V]`` with R = sum(k_b + 1): sequence b owns rows
``offsets[b] .. offsets[b] + k_b`` (its pending token and its k_b drafts). Each sequence is
verified by one of two exact rules, chosen by what its drafter sent:

- **matching** (no q: a deterministic drafter, whose q is one-hot; or a greedy request): the
  target's own choice at each row (argmax, or a sample from p with that position's sample
  uniform) is computed for all rows at once, and drafts are accepted while they equal it. With a
  one-hot q this is the rejection rule under a coupling that makes the output *identical* to
  plain decoding with the same uniforms (same seed, same tokens).
- **rejection sampling** (a sampled draft with its q): ``verify_sampling`` on the sequences that
  have one, padded to their largest k, in one batched call.

The token after the accepted prefix is the target's choice there: recovered on a mismatch,
bonus when every draft matched (for rejection rows, ``verify_sampling`` samples it).

A one-hot draft may be a **tree** (``RoundDraft.tree``: more nodes, each with its parent, on rows
after the chain's). Matching then walks down from the pending token, at each node taking the
child whose token is the target's choice at that node's row (its uniform is that of its depth,
the output position it would fill), so the accepted path is the one plain decoding writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from draftgate.sampling import logits_to_probs, sample_from_probs
from draftgate.verify.rejection import verify_sampling

__all__ = ["RoundDraft", "RoundOutcome", "verify_round", "target_choice"]


@dataclass(frozen=True)
class RoundDraft:
    """One sequence's part of a round."""

    token_ids: Sequence[int]  # k draft ids (k may be 0)
    temperature: float  # 0: greedy
    top_k: int
    top_p: float
    uniforms: Tensor | None  # [k+1, 2] (u_accept, u_sample) per position; None for greedy
    q: Tensor | tuple[Tensor, Tensor] | None = None  # dense [k, V] or sparse ([k, M], [k, M]); None: one-hot
    # One-hot drafts only: more tree nodes (parent node, token), node 0 the pending token, 1..k the
    # chain, k+1.. these; their rows follow the chain's. Siblings carry different tokens.
    tree: Sequence[tuple[int, int]] = ()

    @property
    def num_rows(self) -> int:
        return len(self.token_ids) + 1 + len(self.tree)

    def depths(self) -> list[int]:
        """[num_rows] each node's depth (its output position in the round)."""
        d = list(range(len(self.token_ids) + 1))
        for parent, _ in self.tree:
            d.append(d[parent] + 1)
        return d


@dataclass(frozen=True)
class RoundOutcome:
    emitted: list[list[int]]  # per sequence: accepted drafts + the recovered or bonus token
    accepted: list[int]  # per sequence: drafts accepted
    paths: list[list[int]]  # per sequence: the accepted drafts' nodes (a chain's: 1..accepted)


def target_choice(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, u_sample: Tensor) -> Tensor:
    """The token plain decoding picks at each row: logits [R, V], params [R], u_sample [R] -> [R] int64.

    Greedy rows (temperature 0) take the argmax (ties: lowest id); the others sample p, after
    the request's transforms, by inverse CDF with their row's uniform.
    """
    choice, _, _ = _choices(logits, temperature, top_k, top_p, u_sample)
    return choice


def _choices(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, u_sample: Tensor
) -> tuple[Tensor, Tensor, Tensor | None]:
    """(choice [R], sampled rows [Rs], p of those rows [Rs, V] or None when every row is greedy)."""
    choice = logits.argmax(dim=-1)  # [R]
    rows = (temperature > 0).nonzero().squeeze(1)  # [Rs]
    if rows.numel() == 0:
        return choice, rows, None
    probs = logits_to_probs(logits[rows], temperature[rows], top_k[rows], top_p[rows])  # [Rs, V]
    choice[rows] = sample_from_probs(probs, u_sample[rows])
    return choice, rows, probs


def verify_round(logits: Tensor, drafts: Sequence[RoundDraft], argmax: Tensor | None = None) -> RoundOutcome:
    """Accepted drafts and the next token of every sequence. logits: [R, V], R = sum of num_rows.

    ``argmax`` [R], when the caller has it (the runner computes it with the logits), is each row's
    greedy choice; -1 marks a row with a NaN or an infinite logit, which raises ValueError.
    """
    ks = [len(d.token_ids) for d in drafts]
    R, V = logits.shape
    assert R == sum(d.num_rows for d in drafts), f"logits have {R} rows for drafts of lengths {ks}"
    assert all(not d.tree or d.q is None for d in drafts), "a tree draft is one-hot"
    offsets = [0]
    for d in drafts:
        offsets.append(offsets[-1] + d.num_rows)

    # 1. The target's choice at every row: argmax, or a sample with the row's u_sample.
    if all(d.temperature <= 0 for d in drafts):
        choice = (argmax if argmax is not None else logits.argmax(dim=-1)).tolist()  # [R]: all a greedy round needs
        rows, probs = None, None
        if argmax is not None and min(choice) < 0:
            raise ValueError("the target returned NaN or infinite logits")
    else:
        dev = logits.device  # every per-row tensor beside the logits (CUDA: no cross-device math)

        def per_row(f, dtype):  # noqa: ANN001, ANN202
            return torch.tensor([f(d) for d in drafts for _ in range(d.num_rows)], dtype=dtype, device=dev)

        u = torch.cat(
            [_uniforms(d, k)[d.depths() if d.tree else slice(None)] for d, k in zip(drafts, ks, strict=True)]
        ).to(dev)  # [R, 2]
        c, rows, probs = _choices(
            logits,
            per_row(lambda d: d.temperature, torch.float32),
            per_row(lambda d: d.top_k, torch.int64),
            per_row(lambda d: d.top_p, torch.float32),
            u[:, 1],
        )
        choice = c.tolist()

    # 2. Matching: accept while the draft equals the target's choice (in a tree: a child that does).
    emitted: list[list[int]] = []
    accepted: list[int] = []
    paths: list[list[int]] = []
    for b, d in enumerate(drafts):
        c = choice[offsets[b] : offsets[b + 1]]
        if d.tree:
            path = _tree_path(d, c)
            emitted.append([*(_node_token(d, n) for n in path), c[path[-1] if path else 0]])
        else:
            a = 0
            while a < ks[b] and d.token_ids[a] == c[a]:
                a += 1
            path = list(range(1, a + 1))
            emitted.append([*d.token_ids[:a], c[a]])
        accepted.append(len(path))
        paths.append(path)

    # 3. Rejection sampling for the sequences that sent the q their sampled drafts came from.
    rejection = [b for b, d in enumerate(drafts) if d.q is not None and d.temperature > 0 and ks[b] > 0]
    if rejection:
        assert rows is not None and probs is not None
        for b, (tokens, a) in zip(rejection, _reject(probs, rows, drafts, rejection, offsets), strict=True):
            emitted[b], accepted[b], paths[b] = tokens, a, list(range(1, a + 1))
    return RoundOutcome(emitted, accepted, paths)


def _node_token(d: RoundDraft, n: int) -> int:
    k = len(d.token_ids)
    return d.token_ids[n - 1] if n <= k else d.tree[n - k - 1][1]


def _tree_path(d: RoundDraft, choice: Sequence[int]) -> list[int]:
    """The nodes (row offsets) of a tree draft that the target's choices at their parents' rows pick."""
    k = len(d.token_ids)
    children: dict[tuple[int, int], int] = {(n - 1, t): n for n, t in enumerate(d.token_ids, start=1)}
    for j, (parent, t) in enumerate(d.tree, start=k + 1):
        children[(parent, t)] = j
    path: list[int] = []
    node = 0
    while (nxt := children.get((node, choice[node]))) is not None:
        path.append(nxt)
        node = nxt
    return path


def _uniforms(d: RoundDraft, k: int) -> Tensor:
    return d.uniforms if d.uniforms is not None else torch.zeros(k + 1, 2, dtype=torch.float64)  # [k+1, 2]


def _reject(
    probs: Tensor, rows: Tensor, drafts: Sequence[RoundDraft], seqs: list[int], offsets: list[int]
) -> list[tuple[list[int], int]]:
    """verify_sampling over the sequences ``seqs``, padded to their largest k.

    probs [Rs, V] is p of the sampled rows ``rows`` [Rs] (flat row ids), already transformed.
    """
    V, dev = probs.shape[1], probs.device  # the padded batch is built where p lives
    K = max(len(drafts[b].token_ids) for b in seqs)
    B = len(seqs)
    where = torch.full((int(offsets[-1]),), -1, dtype=torch.int64, device=dev)  # flat row -> index in probs
    where[rows] = torch.arange(rows.numel(), device=dev)
    flat = [offsets[b] + min(j, len(drafts[b].token_ids)) for b in seqs for j in range(K + 1)]  # pad: repeat last
    p = probs[where[torch.tensor(flat, device=dev)]].view(B, K + 1, V)  # [B, K+1, V]
    # Ids and uniforms are padded on the CPU and moved once; q is scattered where p lives.
    draft_ids = torch.full((B, K), -1, dtype=torch.int64)  # [B, K]
    q = torch.zeros(B, K, V, device=dev)  # [B, K, V] dense: sparse q are scattered in
    u = torch.zeros(B, K + 1, 2, dtype=torch.float64)  # [B, K+1, 2]
    for i, b in enumerate(seqs):  # marshal each drafter's q format into the padded batch
        d = drafts[b]
        k = len(d.token_ids)
        draft_ids[i, :k] = torch.tensor(list(d.token_ids), dtype=torch.int64)
        if isinstance(d.q, tuple):
            q[i, :k].scatter_add_(1, d.q[0].to(dev), d.q[1].to(dev).float())
        elif d.q is not None:
            q[i, :k] = d.q.to(dev).float()
        assert d.uniforms is not None
        u[i, : k + 1] = d.uniforms
    draft_lens = torch.tensor([len(drafts[b].token_ids) for b in seqs], dtype=torch.int64, device=dev)  # [B]
    draft_ids, u = draft_ids.to(dev), u.to(dev)
    res = verify_sampling(draft_ids, draft_lens, p, q, u[:, :K, 0], u[:, :, 1])
    tokens = res.tokens.tolist()
    return [(tokens[i][: a + 1], a) for i, a in enumerate(res.num_accepted.tolist())]
