"""A draft head's entries for one sequence: the keys and values its attention reads.

Laid out as the target's native KV cache with one block of ``capacity`` positions (keys transposed,
values by slot: models/native/attention.h), so the native head step (head_step.h) attends them with
the target's own attention routine; the torch step (``EagleHead.extend``) reads them through
``keys`` and ``values``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["HeadCache"]


@dataclass
class HeadCache:
    """One sequence's head entries: keys and values at positions start..start+n-1 of its own attention."""

    k: torch.Tensor  # [Hkv, D, cap] (keys transposed)
    v: torch.Tensor  # [cap, Hkv, D]
    n: int = 0  # entries held
    start: int = 0  # position of entry 0 (a prefix-cached prompt has no features before it)

    @classmethod
    def empty(cls, num_kv_heads: int, head_dim: int, capacity: int, start: int = 0) -> HeadCache:
        k = torch.zeros(num_kv_heads, head_dim, capacity)
        return cls(k, torch.zeros(capacity, num_kv_heads, head_dim), 0, start)

    @property
    def capacity(self) -> int:
        return int(self.v.shape[0])

    def reserve(self, m: int) -> None:
        """Room for m more entries: the capacity grows by itself or by m, whichever is more."""
        if self.n + m > self.capacity:
            more = max(self.capacity, m)
            Hkv, D = self.v.shape[1:]
            self.k = torch.cat([self.k, torch.zeros(Hkv, D, more)], 2)
            self.v = torch.cat([self.v, torch.zeros(more, Hkv, D)], 0)

    def write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store m entries' keys and values [Hkv, m, D] after the n held (``n`` is the caller's to advance)."""
        m = k.shape[1]
        self.reserve(m)
        self.k[:, :, self.n : self.n + m] = k.transpose(1, 2)
        self.v[self.n : self.n + m] = v.transpose(0, 1)

    def keys(self, n: int | None = None) -> torch.Tensor:
        """The first n entries' keys [Hkv, n, D] (a view; default: the n held)."""
        return self.k[:, :, : self.n if n is None else n].transpose(1, 2)

    def values(self, n: int | None = None) -> torch.Tensor:
        """The first n entries' values [Hkv, n, D] (a view; default: the n held)."""
        return self.v[: self.n if n is None else n].transpose(0, 1)
