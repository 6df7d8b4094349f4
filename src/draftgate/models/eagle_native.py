"""The EAGLE draft head on the native kernels: its frozen products packed once, and the C struct
of models/native/head_step.h that runs a whole head step for B sequences in one call.

``EagleHead.use_native`` attaches a ``NativeHead``; the head packs its products through it, binds
its frozen tensors to it, and hands it the step when it drafts (``EagleHead.step_many``). Measured
in the engine's thread (docs/BENCHMARKS.md): torch's small GEMMs there pay a thread wake-up each
while the native pool spins, and bfloat16 halves the bytes a step streams after the target's
forward has evicted the head from the cache. Drafts are verified, so the head's rounding changes
acceptance at most, never the output.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import torch

from draftgate.models.config import ModelConfig
from draftgate.models.eagle_cache import HeadCache
from draftgate.models.native.build import NativeLib
from draftgate.models.native_llama import PackedLinear

__all__ = ["NativeHead", "TENSORS"]

_PACKED = ("fuse", "inp", "qkv", "o", "gate_up", "down", "out")  # dg_head_new's order
# The frozen head's float tensors, in dg_head_new's order: inv_freq [D/2], norm_f [nF, C], the norms [C].
TENSORS = ("inv_freq", "norm_f", "norm_e", "norm_g", "norm_attn", "norm_mlp", "norm_out")
Products = dict[str, Callable[[torch.Tensor], torch.Tensor]]  # name -> y = x @ W^T (PackedLinear here)


class NativeHead:
    """One frozen head's native side: products stored as ``dtype`` and the head step's C handle.

    The handle points into the tensors and packed products it keeps; ``close`` frees it (as
    garbage collection does), and the next ``pack`` and ``bind`` build it again.
    """

    def __init__(self, lib: NativeLib, dtype: torch.dtype) -> None:
        self.lib, self.dtype = lib, dtype
        self._packed: dict[str, PackedLinear] | None = None
        self._handle: int | None = None
        self._keep: object = None
        self._sizes = (0, 0)  # hidden size C, output rows Vs
        self._free: weakref.finalize | None = None

    def pack(self, weights: dict[str, torch.Tensor]) -> Products:
        """Each product's weight [N, K] packed for the native pool (``bind`` builds the step on them)."""
        self._packed = {k: PackedLinear(self.lib, v, self.dtype) for k, v in weights.items()}
        return dict(self._packed)

    @property
    def bound(self) -> bool:
        return self._handle is not None

    def bind(self, cfg: ModelConfig, tensors: dict[str, torch.Tensor], embed: torch.Tensor) -> None:
        """Build the step's C struct on the packed products, the head's ``TENSORS`` and the target's
        embedding [V, C] (float32)."""
        assert self._packed is not None, "pack the products first"
        keep = [tensors[k].detach().to(torch.float32).contiguous() for k in TENSORS] + [embed.contiguous()]
        out = self._packed["out"]
        h = self.lib.cdll.dg_head_new(
            cfg.hidden_size,
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.intermediate_size,
            keep[1].shape[0],
            cfg.rms_norm_eps,
            *[t.data_ptr() for t in keep[:7]],
            *[self._packed[k].handle for k in _PACKED],
            keep[7].data_ptr(),
            keep[7].shape[0],
        )
        self._handle, self._keep = h, (keep, dict(self._packed))  # the C struct points into these
        self._sizes = (cfg.hidden_size, out.N)
        self._free = weakref.finalize(self, self.lib.cdll.dg_head_free, h)

    def close(self) -> None:
        """Free the C struct and forget the products (the head's weights or kernels changed)."""
        if self._free is not None:
            self._free()
        self._packed, self._handle, self._keep, self._free = None, None, None, None

    def step(
        self,
        caches: Sequence[HeadCache],
        tokens: Sequence[torch.Tensor],
        x_list: Sequence[torch.Tensor],
        features: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One C call for ``EagleHead.step_many``: the inputs ``x_list`` are the target's raw features
        [m_b, nF, C] when ``features``, else the head's own outputs [m_b, C]; returns (h [B, C], logits [B, Vs])."""
        assert self._handle is not None, "bind first"
        B = len(caches)
        m = torch.tensor([x.shape[0] for x in x_list], dtype=torch.int32)  # [B]
        for c, mb in zip(caches, m.tolist(), strict=True):
            c.reserve(mb)
        x = torch.cat(list(x_list)).to(torch.float32).contiguous()  # [M, nF, C] or [M, C]
        toks = torch.cat([t.reshape(-1) for t in tokens]).to(torch.int64).contiguous()  # [M]
        if toks.numel() != int(m.sum()):
            raise ValueError("one token per new entry")
        meta = torch.tensor(
            [[c.start + c.n, c.k.data_ptr(), c.v.data_ptr(), c.n, c.capacity] for c in caches], dtype=torch.int64
        ).T.contiguous()  # [5, B]: pos0, key and value addresses, n, capacity
        C, Vs = self._sizes
        h = torch.empty(B, C)  # [B, C]
        logits = torch.empty(B, Vs)  # [B, Vs]
        best = torch.empty(B, dtype=torch.int64)  # [B]
        rc = self.lib.cdll.dg_head_step(
            self._handle,
            B,
            m.data_ptr(),
            x.data_ptr() if features else None,
            x.data_ptr() if not features else None,
            toks.data_ptr(),
            *[meta[i].data_ptr() for i in range(5)],
            h.data_ptr(),
            logits.data_ptr(),
            best.data_ptr(),
        )
        if rc != 0:
            msg = self.lib.cdll.dg_last_error().decode()
            raise (IndexError if rc == 2 else RuntimeError)(f"native head step failed: {msg}")
        for c, mb in zip(caches, m.tolist(), strict=True):
            c.n += mb
        return h, logits
