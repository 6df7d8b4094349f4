"""One ragged forward as the runner describes it to a model implementation (no tensors yet).

B sequences, sequence b appends ``new_lens[b]`` tokens (N = sum of them, flattened in order)
and wants logits for its last ``logits_per_seq[b]`` positions (R = sum of those). Token position
t of sequence b lives in KV slot ``block_tables[b][t // block_size] * block_size + t % block_size``;
``ctx_lens[b]`` is its length once the new tokens are written.
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

    @property
    def num_rows(self) -> int:
        return len(self.tokens)

    def positions(self) -> list[int]:
        """[N] absolute position of each new token."""
        return [p for S, n in zip(self.ctx_lens, self.new_lens, strict=True) for p in range(S - n, S)]

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
