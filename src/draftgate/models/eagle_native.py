"""The EAGLE draft head on the native kernels: its frozen products packed once, and the C struct
of models/native/head_step.h that runs a whole head step for B sequences in one call.

``EagleHead.use_native`` attaches a ``NativeHead``; the head builds its products through it and
hands it the step when it drafts (``EagleHead.step_many``). Measured in the engine's thread
(docs/BENCHMARKS.md): torch's small GEMMs there pay a thread wake-up each while the native pool
spins, and bfloat16 halves the bytes a step streams after the target's forward has evicted the
head from the cache. Drafts are verified, so the head's rounding changes acceptance at most,
never the output.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from draftgate.models.native.build import NativeLib
from draftgate.models.native_llama import PackedLinear

if TYPE_CHECKING:
    from draftgate.models.eagle import EagleHead, HeadCache

__all__ = ["NativeHead"]

_PACKED = ("fuse", "inp", "qkv", "o", "gate_up", "down", "out")  # dg_head_new's order
Products = dict[str, Callable[[torch.Tensor], torch.Tensor]]  # name -> y = x @ W^T (PackedLinear here)


class NativeHead:
    """One frozen head's native side: products stored as ``dtype`` and the head step's C handle.

    The handle points into the tensors and packed products it keeps; ``close`` frees it (as
    garbage collection does), and the next ``handle`` builds it again.
    """

    def __init__(self, lib: NativeLib, dtype: torch.dtype) -> None:
        self.lib, self.dtype = lib, dtype
        self._handle: int | None = None
        self._keep: object = None
        self._free: weakref.finalize | None = None

    def pack(self, weights: dict[str, torch.Tensor]) -> Products:
        """Each product's weight [N, K] packed for the native pool."""
        return {k: PackedLinear(self.lib, v, self.dtype) for k, v in weights.items()}

    def close(self) -> None:
        """Free the C struct (the head's weights or kernels changed)."""
        if self._free is not None:
            self._free()
        self._handle, self._keep, self._free = None, None, None

    def handle(self, head: EagleHead, products: Products) -> int:
        """The C handle of ``head`` (frozen, its target attached), built once with ``products``."""
        if self._handle is None:
            assert head.embed is not None
            c = head.tcfg
            keep = [t.detach().to(torch.float32).contiguous() for t in (
                head.inv_freq, head.norm_f, head.norm_e, head.norm_g, head.norm_attn, head.norm_mlp, head.norm_out,
            )] + [head.embed.contiguous()]  # fmt: skip
            h = self.lib.cdll.dg_head_new(
                c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                len(head.feature_layers), c.rms_norm_eps, *[t.data_ptr() for t in keep[:7]],
                *[products[k]._h for k in _PACKED], keep[7].data_ptr(), keep[7].shape[0],  # type: ignore[attr-defined]
            )  # fmt: skip
            self._handle, self._keep = h, (keep, dict(products))  # the C struct points into these
            self._free = weakref.finalize(self, self.lib.cdll.dg_head_free, h)
        return self._handle

    def step(
        self,
        head: EagleHead,
        products: Products,
        caches: Sequence[HeadCache],
        tokens: Sequence[torch.Tensor],
        x_list: Sequence[torch.Tensor],
        features: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One C call for ``EagleHead.step_many``: the inputs ``x_list`` are the target's raw features
        [m_b, nF, C] when ``features``, else the head's own outputs [m_b, C]; returns (h [B, C], logits [B, Vs])."""
        B = len(caches)
        m = torch.tensor([x.shape[0] for x in x_list], dtype=torch.int32)  # [B]
        for c, mb in zip(caches, m.tolist(), strict=True):
            c.reserve(mb)
        x = torch.cat(list(x_list)).to(torch.float32).contiguous()  # [M, nF, C] or [M, C]
        toks = torch.cat([t.reshape(-1) for t in tokens]).to(torch.int64).contiguous()  # [M]
        if toks.numel() != int(m.sum()):
            raise ValueError("one token per new entry")
        meta = torch.tensor(
            [[c.start + c.n, c.k.data_ptr(), c.v.data_ptr(), c.n, c.k.shape[1]] for c in caches], dtype=torch.int64
        ).T.contiguous()  # [5, B]: pos0, key and value addresses, n, capacity
        h = torch.empty(B, head.tcfg.hidden_size)  # [B, C]
        logits = torch.empty(B, head.vocab_ids.numel())  # [B, Vs]
        best = torch.empty(B, dtype=torch.int64)
        handle = self.handle(head, products)
        rc = self.lib.cdll.dg_head_step(
            handle, B, m.data_ptr(), x.data_ptr() if features else None,
            x.data_ptr() if not features else None, toks.data_ptr(),
            *[meta[i].data_ptr() for i in range(5)], h.data_ptr(), logits.data_ptr(), best.data_ptr(),
        )  # fmt: skip
        if rc != 0:
            msg = self.lib.cdll.dg_last_error().decode()
            raise (IndexError if rc == 2 else RuntimeError)(f"native head step failed: {msg}")
        for c, mb in zip(caches, m.tolist(), strict=True):
            c.n += mb
        return h, logits
