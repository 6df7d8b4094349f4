"""One ragged forward as the runner describes it to a model implementation (no tensors yet).

B sequences, sequence b appends ``new_lens[b]`` tokens (N = sum of them, flattened in order)
and wants logits for its last ``logits_per_seq[b]`` positions (R = sum of those). Token position
t of sequence b lives in KV slot ``block_tables[b][t // block_size] * block_size + t % block_size``;
``ctx_lens[b]`` is its length once the new tokens are written.

A sequence's new rows may form a draft tree (``parents``): row i follows row ``parents[b][i]``
(-1: the committed context, the first row only) instead of row i - 1. Its KV still goes to slot
index ``ctx_lens[b] - new_lens[b] + i``, but its position (RoPE, and the keys it attends) is the
context's length plus its depth, and it attends the context and its own ancestors only: a tree
node computes what plain decoding computes at its position along its path. The runner moves the
accepted path's KV into place afterwards (``ModelRunner.keep_path``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["RaggedBatch", "ForwardOutput"]


@dataclass(frozen=True)
class ForwardOutput:
    """What a forward returns for its R logit rows."""

    logits: torch.Tensor  # [R, V] float32
    argmax: torch.Tensor  # [R] int64 greedy choice (first maximum); -1 where a row holds a NaN or an inf
    features: torch.Tensor | None = None  # [RF, len(feature_layers), C] float32 when the batch asked for any


@dataclass(frozen=True)
class RaggedBatch:
    tokens: list[int]  # [N] the new tokens of every sequence, in order
    new_lens: list[int]  # [B]
    ctx_lens: list[int]  # [B] length after this forward
    logits_per_seq: list[int]  # [B] each in 1..new_lens[b]
    block_tables: list[list[int]]  # [B][ceil(ctx_lens[b] / block_size)]
    block_size: int
    # Hidden states to return, computed anyway (draft heads read them): l < L is the residual stream
    # after layer l, L the final normed hidden (what the LM head reads); for the last
    # ``features_per_seq[b]`` rows of each sequence (None: its logit rows; RF = their sum).
    feature_layers: tuple[int, ...] = ()
    features_per_seq: list[int] | None = None  # [B] each in 1..new_lens[b]
    parents: list[list[int]] | None = None  # [B][new_lens[b]] a draft tree's parent rows (None: chains)

    def depths(self, b: int) -> list[int]:
        """[new_lens[b]] each new row's depth below the context (a chain: 0, 1, 2, ...)."""
        if self.parents is None:
            return list(range(self.new_lens[b]))
        out: list[int] = []
        for par in self.parents[b]:
            out.append(0 if par < 0 else out[par] + 1)
        return out

    @property
    def num_rows(self) -> int:
        return len(self.tokens)

    def positions(self) -> list[int]:
        """[N] absolute position of each new token (in a tree: the context's length plus its depth)."""
        return [
            S - n + d for b, (S, n) in enumerate(zip(self.ctx_lens, self.new_lens, strict=True)) for d in self.depths(b)
        ]

    def slot_indices(self) -> list[int]:
        """[N] where in its sequence's slots each new token's KV goes (its position, for a chain)."""
        return [t for S, n in zip(self.ctx_lens, self.new_lens, strict=True) for t in range(S - n, S)]

    def flat_parents(self) -> list[int]:
        """[N] the row (of the flat batch) each new row follows, -1 for a sequence's first."""
        out: list[int] = []
        start = 0
        for b, n in enumerate(self.new_lens):
            par = self.parents[b] if self.parents is not None else list(range(-1, n - 1))
            out.extend(-1 if p < 0 else start + p for p in par)
            start += n
        return out

    def row_seq(self) -> list[int]:
        """[N] the sequence index of each row."""
        return [b for b, n in enumerate(self.new_lens) for _ in range(n)]

    def logit_rows(self) -> list[int]:
        """[R] the rows whose logits come back, sequence by sequence."""
        return self._last_rows(self.logits_per_seq)

    def feature_rows(self) -> list[int]:
        """[RF] the rows whose features come back, sequence by sequence."""
        return self._last_rows(self.logits_per_seq if self.features_per_seq is None else self.features_per_seq)

    def _last_rows(self, per_seq: list[int]) -> list[int]:
        rows: list[int] = []
        start = 0
        for n, r in zip(self.new_lens, per_seq, strict=True):
            rows.extend(range(start + n - r, start + n))
            start += n
        return rows

    def slots(self, b: int) -> list[int]:
        """Flat KV slots of positions 0..ctx_lens[b]-1 of sequence b."""
        bs, table = self.block_size, self.block_tables[b]
        return [table[t // bs] * bs + t % bs for t in range(self.ctx_lens[b])]
