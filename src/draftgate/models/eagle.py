"""An EAGLE-style draft head: one decoder layer over the target's own hidden states.

At position t the head reads ``g_t`` (the target's features at t: the residual stream after a
few layers, low / mid / high as in EAGLE-3, fused by one linear map) and the embedding of the
token after it, ``x_{t+1}``; one Llama decoder layer (attending over the head's own entries at
earlier positions) turns them into ``h_t``, a prediction of the target's state at t + 1, and the
target's own output rows, restricted to the most frequent tokens (FR-Spec), give the draft's
logits for ``x_{t+2}``. Drafting a chain feeds ``h`` back in place of ``g``: draft j reads the
head's own output of draft j - 1 ("training-time test" in EAGLE-3 trains exactly that rollout).

The embedding and the output rows are the target's, frozen and never saved: the folder a head
saves to and loads from, and the check that it belongs to this target, are ``eagle_format``'s;
a sequence's entries (``HeadCache``) are ``eagle_cache``'s; drafting on the native kernels
(``use_native``) is ``eagle_native``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from draftgate.models.config import ModelConfig, rope_inv_freq
from draftgate.models.eagle_cache import HeadCache
from draftgate.models.eagle_format import read_head, write_head
from draftgate.models.eagle_native import TENSORS, NativeHead
from draftgate.models.native.build import NativeLib
from draftgate.models.rope import apply_rope, rope_cos_sin

__all__ = ["EagleHead", "HeadCache", "default_feature_layers"]

_MODULES = {"fuse": "fuse", "inp": "inp", "o": "o_proj", "down": "down_proj"}  # products with one weight


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """Low, mid and high (EAGLE-3): after layer 2, after the middle layer, and the final normed hidden."""
    return tuple(sorted({min(2, num_layers), num_layers // 2, num_layers}))


class EagleHead(nn.Module):
    def __init__(self, tcfg: ModelConfig, feature_layers: tuple[int, ...], vocab_ids: torch.Tensor) -> None:
        super().__init__()
        C, D, H, Hkv, Fh = (tcfg.hidden_size, tcfg.head_dim, tcfg.num_heads, tcfg.num_kv_heads, tcfg.intermediate_size)
        self.tcfg, self.feature_layers = tcfg, tuple(feature_layers)
        # Each layer's features RMS-normalised first: the residual stream's scale grows with depth
        # (and a few dimensions carry massive activations), so raw concatenation lets one layer drown the rest.
        self.norm_f = nn.Parameter(torch.ones(len(self.feature_layers), C))
        self.fuse = nn.Linear(len(self.feature_layers) * C, C, bias=False)
        self.inp = nn.Linear(2 * C, C, bias=False)
        self.norm_e, self.norm_g = nn.Parameter(torch.ones(C)), nn.Parameter(torch.ones(C))
        self.q_proj = nn.Linear(C, H * D, bias=False)
        self.k_proj = nn.Linear(C, Hkv * D, bias=False)
        self.v_proj = nn.Linear(C, Hkv * D, bias=False)
        self.o_proj = nn.Linear(H * D, C, bias=False)
        self.gate_proj = nn.Linear(C, Fh, bias=False)
        self.up_proj = nn.Linear(C, Fh, bias=False)
        self.down_proj = nn.Linear(Fh, C, bias=False)
        self.norm_attn, self.norm_mlp = nn.Parameter(torch.ones(C)), nn.Parameter(torch.ones(C))
        self.norm_out = nn.Parameter(torch.ones(C))
        self.register_buffer("vocab_ids", vocab_ids.to(torch.int64).clone())  # [Vs] target ids of the head's rows
        self.register_buffer("inv_freq", rope_inv_freq(tcfg), persistent=False)  # [D/2]
        self.embed: torch.Tensor | None = None  # [V, C] the target's, frozen (attach_target)
        self.out_rows: torch.Tensor | None = None  # [Vs, C] the target's output rows, frozen
        self._fast: dict[str, Callable[[torch.Tensor], torch.Tensor]] | None = None  # drafting's products
        self._native: NativeHead | None = None  # drafting on the native kernels (use_native)
        self.feature_noise = 0.0  # training only (train.eagle sets it)

    # ------------------------------------------------------------------ build

    def attach_target(self, weights: dict[str, torch.Tensor]) -> EagleHead:
        emb = weights["model.embed_tokens.weight"]
        head = weights.get("lm_head.weight", emb)
        dev = self.vocab_ids.device  # the head's own device (``.to(device)`` before attaching)
        self.embed = emb.to(dev).float()  # [V, C]
        self.out_rows = head.to(dev)[self.vocab_ids].float().contiguous()  # [Vs, C]
        self._drop_fast()
        return self

    def init_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Small random matrices, unit norms, and the target's final norm before the output rows.

        (Measured on SmolLM2: starting the layer from the target's last layer learned slower,
        24.9% vs 27.9% held-out agreement after 100 steps.)
        """
        with torch.no_grad():
            for p in self.parameters():
                if p.ndim == 2:
                    nn.init.normal_(p, std=0.02)
            self.norm_out.copy_(weights["model.norm.weight"].float())

    def save(self, folder: Path, meta: dict) -> None:
        """Write the head folder (``eagle_format``): the trainable weights, the vocabulary subset, ``meta``."""
        write_head(folder, self.state_dict(), self.vocab_ids, self.feature_layers, meta)

    @classmethod
    def load(cls, folder: Path, tcfg: ModelConfig, weights: dict[str, torch.Tensor]) -> EagleHead:
        """The head saved in ``folder``, for this target only (``check_target``), attached to it, frozen."""
        meta, state = read_head(folder, tcfg, weights)
        head = cls(tcfg, tuple(meta["feature_layers"]), state.pop("vocab_ids").long())
        head.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
        return head.attach_target(weights).eval()

    # ------------------------------------------------------------------ math

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), w, self.tcfg.rms_norm_eps)

    def fused(self, feats: torch.Tensor) -> torch.Tensor:
        """Target features [..., nF, C] -> g [..., C]."""
        f = feats * torch.rsqrt(feats.pow(2).mean(-1, keepdim=True) + self.tcfg.rms_norm_eps)
        if self.training and self.feature_noise > 0:  # EAGLE's feature noise: the head must not trust them blindly
            f = f + self.feature_noise * torch.randn_like(f)
        return self._lin("fuse", (f * self.norm_f).flatten(-2))

    def _input(self, g: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """(g [..., C], the next token ids [...]) -> the layer's input u [..., C]."""
        assert self.embed is not None, "attach_target first"
        e = self.embed[tokens]  # [..., C]
        return self._lin("inp", torch.cat([self._rms(e, self.norm_e), self._rms(g, self.norm_g)], dim=-1))

    def _qkv(self, u: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """u [B, T, C] at positions pos [T] -> q [B, H, T, D], k and v [B, Hkv, T, D]."""
        c = self.tcfg
        B, T, _ = u.shape
        H, Hkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        h = self._rms(u, self.norm_attn)
        q, k, v = self._lin("qkv", h).split([H * D, Hkv * D, Hkv * D], dim=-1)
        cos, sin = rope_cos_sin(pos, self.inv_freq)  # [T, D]
        q = apply_rope(q.view(B, T, H, D).transpose(1, 2), cos, sin)
        k = apply_rope(k.view(B, T, Hkv, D).transpose(1, 2), cos, sin)
        return q, k, v.view(B, T, Hkv, D).transpose(1, 2)

    def _finish(self, u: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Residual, MLP: u [B, T, C], attention output a [B, H, T, D] -> h [B, T, C]."""
        B, T, _ = u.shape
        x = u + self._lin("o", a.transpose(1, 2).reshape(B, T, -1))
        gate, up = self._lin("gate_up", self._rms(x, self.norm_mlp)).chunk(2, dim=-1)
        return x + self._lin("down", F.silu(gate) * up)

    def normed(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., C] -> the predicted final normed hidden [..., C] (what the output rows read)."""
        return self._rms(h, self.norm_out)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., C] -> logits over the subset [..., Vs]."""
        assert self.out_rows is not None, "attach_target first"
        return self._lin("out", self.normed(h))

    # ------------------------------------------------------------- products

    def use_native(self, lib: NativeLib, dtype: torch.dtype = torch.bfloat16) -> EagleHead:
        """Draft with the products on the native kernels' pool, weights stored as ``dtype`` (``NativeHead``)."""
        self._drop_fast()
        self._native = NativeHead(lib, dtype)
        return self

    def prepare(self) -> EagleHead:
        """Build the frozen products (and the native step's struct) now, not in the first draft call:
        packing them costs that call ~10x its steady price (measured: 0.61 vs 0.07 ms a caught-up
        token), which the engine would otherwise learn as the head's catch-up price."""
        if not self.training and self.out_rows is not None:
            if self._native is not None:
                self._bound_native()
            else:
                self._products()
        return self

    def _bound_native(self) -> NativeHead:
        """The native side with the products packed and the step's C struct built (once)."""
        assert self._native is not None and self.embed is not None
        self._products()
        if not self._native.bound:
            self._native.bind(self.tcfg, {k: getattr(self, k) for k in TENSORS}, self.embed)
        return self._native

    def _drop_fast(self) -> None:
        """Forget the frozen products and the native step's struct (weights or kernels changed)."""
        if self._native is not None:
            self._native.close()
        self._fast = None

    def _weights(self) -> dict[str, torch.Tensor]:
        """Every product's weight [N, K], q|k|v and gate|up concatenated (one product each)."""
        assert self.out_rows is not None, "attach_target first"
        return {
            "fuse": self.fuse.weight,
            "inp": self.inp.weight,
            "qkv": torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]),
            "o": self.o_proj.weight,
            "gate_up": torch.cat([self.gate_proj.weight, self.up_proj.weight]),
            "down": self.down_proj.weight,
            "out": self.out_rows,
        }

    def _lin(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Product ``name`` of x [..., K]: autograd's while training, the frozen drafting ones otherwise."""
        if self.training:
            if name == "qkv":
                return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
            if name == "gate_up":
                return torch.cat([self.gate_proj(x), self.up_proj(x)], dim=-1)
            return F.linear(x, self.out_rows) if name == "out" else getattr(self, _MODULES[name])(x)
        return self._products()[name](x)

    def _products(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        """The frozen head's products (native PackedLinear with ``use_native``, else F.linear), built once."""
        if self._fast is None:
            with torch.no_grad():
                w = {k: v.detach().contiguous() for k, v in self._weights().items()}
                if self._native is not None:
                    self._fast = self._native.pack(w)
                else:
                    self._fast = {k: partial(F.linear, weight=v) for k, v in w.items()}
        return self._fast

    def train(self, mode: bool = True) -> EagleHead:
        self._drop_fast()  # weights may change
        return super().train(mode)

    # -------------------------------------------------------------- training

    def rollout(
        self, feats: torch.Tensor, nxt: torch.Tensor, steps: int, states: list[torch.Tensor] | None = None
    ) -> list[torch.Tensor]:
        """Training-time test over dense batches: logits [B, T, Vs] for each rollout step 1..steps.

        feats [B, T, nF, C]: the target's features at t; nxt [B, T + steps - 1]: the token after
        each position (x_{t+1}, ...). Step 1 at anchor t reads (g_t, x_{t+1}) and attends to steps-1
        entries at positions <= t; step j reads (its own step j-1 output, x_{t+j}) at position
        t + j - 1 and attends to the true entries <= t plus its own anchor's entries of steps
        2..j, exactly what a drafted chain sees. Its logits predict x_{t+j+1}. ``states``, if given,
        receives each step's predicted state as the output rows read it (``normed``, [B, T, C]).
        """
        c = self.tcfg
        B, T = feats.shape[:2]
        rep = c.num_heads // c.num_kv_heads
        pos = torch.arange(T, device=feats.device)
        g = self.fused(feats)  # [B, T, C]
        causal = torch.ones(T, T, dtype=torch.bool, device=feats.device).tril()
        k1 = v1 = None
        extra: list[tuple[torch.Tensor, torch.Tensor]] = []  # steps 2..j: k, v [B, H, T, D]
        out = []
        for j in range(1, steps + 1):
            u = self._input(g, nxt[:, j - 1 : j - 1 + T])  # [B, T, C]
            q, k, v = self._qkv(u, pos + (j - 1))
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)  # [B, H, T, D]
            if j == 1:
                k1, v1 = k, v
            else:
                extra.append((k, v))
            assert k1 is not None and v1 is not None
            s = (q @ k1.transpose(-1, -2)).masked_fill(~causal, float("-inf"))  # [B, H, T, T]
            diag = [(q * ke).sum(-1, keepdim=True) for ke, _ in extra]  # each [B, H, T, 1]
            p = torch.softmax(torch.cat([s, *diag], dim=-1) / c.head_dim**0.5, dim=-1)
            a = p[..., :T] @ v1  # [B, H, T, D]
            for i, (_, ve) in enumerate(extra):
                a = a + p[..., T + i : T + i + 1] * ve
            h = self._finish(u, a)  # [B, T, C]
            n = self.normed(h)  # [B, T, C] what the output rows read
            out.append(self._lin("out", n))  # [B, T, Vs]
            if states is not None:
                states.append(n)
            g = h
        return out

    # ------------------------------------------------------------- inference

    def new_cache(self, capacity: int, start: int = 0) -> HeadCache:
        return HeadCache.empty(self.tcfg.num_kv_heads, self.tcfg.head_dim, capacity, start)

    @torch.inference_mode()
    def step(
        self, cache: HeadCache, tokens: torch.Tensor, feats: torch.Tensor | None = None, g: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add m entries to one sequence's cache; return the last one's (h [C], logits [Vs]).

        ``feats`` [m, nF, C] (the target's raw features) or ``g`` [m, C] (the head's own output);
        ``tokens`` [m]. ``step_many`` for one sequence.
        """
        h, logits = self.step_many([cache], [tokens], None if feats is None else [feats], None if g is None else [g])
        return h[0], logits[0]

    @torch.inference_mode()
    def step_many(
        self,
        caches: Sequence[HeadCache],
        tokens: Sequence[torch.Tensor],
        feats: Sequence[torch.Tensor] | None = None,
        g: Sequence[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add entries to B sequences' caches; return each one's last (h [B, C], logits [B, Vs]).

        Per sequence b: either the target's raw features ``feats[b]`` [m_b, nF, C] (the positions
        committed since its last draft) or ``g[b]`` [m_b, C] (a chain step: the head's own output),
        and ``tokens[b]`` [m_b] int64, the token after each entry's position. With native kernels
        (``use_native``) one C call does all of it, the products once over every sequence's rows
        (models/native/head_step.h); else ``extend`` and ``logits`` in torch, one sequence at a time.
        """
        if (feats is None) == (g is None):
            raise ValueError("give the target's features or g, not both")
        x_list = list(feats if feats is not None else g)  # type: ignore[arg-type]
        if not (len(caches) == len(tokens) == len(x_list)) or not caches:
            raise ValueError("one cache, token tensor and input per sequence, at least one")
        if self._native is None or self.training:
            hs = [
                self.extend(c, self.fused(x) if feats is not None else x, t)
                for c, x, t in zip(caches, x_list, tokens, strict=True)
            ]
            h = torch.stack(hs)  # [B, C]
            return h, self.logits(h)
        return self._bound_native().step(caches, tokens, x_list, feats is not None)

    @torch.inference_mode()
    def extend(self, cache: HeadCache, g: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Add m entries (g [m, C], the next tokens [m]) after the cache's; return h of the last [C].

        True features' entries stay; a draft's entries are dropped again with ``truncate``.
        """
        m = g.shape[0]
        u = self._input(g, tokens)[None]  # [1, m, C]
        pos = torch.arange(cache.start + cache.n, cache.start + cache.n + m)
        q, k, v = self._qkv(u, pos)  # q [1, H, m, D], k v [1, Hkv, m, D]
        cache.write(k[0], v[0])
        n = cache.n + m
        a = F.scaled_dot_product_attention(
            q[:, :, -1:], cache.keys(n)[None], cache.values(n)[None], enable_gqa=True
        )  # [1, H, 1, D]: only the last entry's output is needed
        cache.n = n
        return self._finish(u[:, -1:], a)[0, 0]  # [C]

    def truncate(self, cache: HeadCache, n: int) -> None:
        cache.n = min(cache.n, n)
