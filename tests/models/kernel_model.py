"""The native quantized products modeled rounding by rounding in numpy: what each kernel level must
return bitwise (models/native/qgemm.h, gemm.h).

The blocks are decoded here independently of the packer (codes, and each sub-block's d and m computed
in float32 as the kernels compute them: d16 * sc, -(dmin16 * mn), Q4_0's -8 d). The model then runs
the kernel the product takes at a level: the integer kernel (activations quantized to 8 bits per group
of 16 or 32, exact integer dot products, each group's scales applied in float32 in group order) or the
float kernel (weights (u - zero) * d + m by FMA, FMA chains over chunks of 64 k added in order). An FMA
rounds once (float64 holds the exact product), except at the portable level, whose "fma" is a
multiply and an add.
"""

from __future__ import annotations

import numpy as np
import torch

from draftgate.models.gguf_blocks import BLOCK_LAYOUT, Blocks

F32, F64 = np.float32, np.float64
FLOATS = ("F32", "F16", "BF16")
BITS = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5, "Q6_K": 6, "Q8_0": 8}
KC = 64  # the float kernel's chunk along K (packed.h)


def int_kernel(level: str, formats: list[str]) -> bool:
    """Whether a product of these formats runs the integer kernel at ``level``: with VNNI any quantized
    product; with AVX-512 or AVX2 one whose codes have at most 5 bits (maddubs' pair sums stay exact)."""
    bits = max((BITS[f] for f in formats if f in BITS), default=0)
    return bits > 0 and (level == "avx512vnni" or (level != "portable" and bits <= 5))


def _f16(raw: np.ndarray, off: int) -> np.ndarray:  # [N, B, bytes] -> the float16 at `off` of each block [N, B]
    return raw[:, :, off : off + 2].copy().view(np.float16)[..., 0].astype(F32)


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # Q4_K/Q5_K's 12 bytes [N, B, 12] -> [N, B, 8] each
    s = s.astype(np.int64)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], -1)
    mn = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
    return sc.astype(F32), mn.astype(F32)


def codes_and_scales(b: Blocks) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """A quantized part as the kernels see it: q = u - zero [N, K] int64, d and m float32 [N, K / sub]
    (one per sub-block along K), and sub."""
    per, nbytes = BLOCK_LAYOUT[b.format]
    N, K, fmt = b.N, b.K, b.format
    raw = b.data.numpy().reshape(N, K // per, nbytes)
    if fmt in ("Q4_0", "Q4_1", "Q5_0", "Q5_1"):
        has_m, q5 = fmt.endswith("1"), fmt.startswith("Q5")
        off = 4 if has_m else 2
        qs = raw[:, :, off + (4 if q5 else 0) :].astype(np.int64)  # [N, B, 16]
        q = np.concatenate([qs & 15, qs >> 4], -1)  # weight j: low nibble of byte j; j + 16: its high one
        if q5:
            qh = raw[:, :, off : off + 4].copy().view(np.uint32).astype(np.int64)  # [N, B, 1]
            q |= ((qh >> np.arange(32)) & 1) << 4
        d = _f16(raw, 0)
        m = _f16(raw, 2) if has_m else F32(-16.0 if q5 else -8.0) * d
        return q.reshape(N, K), d, m, 32
    if fmt == "Q8_0":
        return raw[:, :, 2:].view(np.int8).astype(np.int64).reshape(N, K), _f16(raw, 0), np.zeros((N, K // 32), F32), 32
    if fmt in ("Q4_K", "Q5_K"):
        q5 = fmt == "Q5_K"
        sc, mn = _k_scale_min(raw[:, :, 4:16])
        qs = raw[:, :, 48 if q5 else 16 :].astype(np.int64)  # [N, B, 128]
        subs = []
        for j in range(8):  # sub-block j: low (j even) or high nibbles of qs[32 * (j // 2):], bit j of qh
            u = (qs[:, :, 32 * (j // 2) : 32 * (j // 2) + 32] >> (4 * (j % 2))) & 15
            subs.append(u | ((((raw[:, :, 16:48].astype(np.int64) >> j) & 1) << 4) if q5 else 0))
        d = (_f16(raw, 0)[..., None] * sc).reshape(N, -1)
        m = -(_f16(raw, 2)[..., None] * mn).reshape(N, -1)
        return np.concatenate(subs, -1).reshape(N, K), d, m, 32
    assert fmt == "Q6_K", fmt
    ql, qh = raw[:, :, :128].astype(np.int64), raw[:, :, 128:192].astype(np.int64)
    halves = []
    for n in range(2):
        lo, hi = ql[:, :, 64 * n : 64 * n + 64], qh[:, :, 32 * n : 32 * n + 32]
        halves += [
            (lo[..., :32] & 15) | ((hi & 3) << 4),
            (lo[..., 32:] & 15) | (((hi >> 2) & 3) << 4),
            (lo[..., :32] >> 4) | (((hi >> 4) & 3) << 4),
            (lo[..., 32:] >> 4) | (((hi >> 6) & 3) << 4),
        ]
    sc = raw[:, :, 192:208].copy().view(np.int8).astype(F32)  # [N, B, 16]
    d = (_f16(raw, 208)[..., None] * sc).reshape(N, -1)
    return np.concatenate(halves, -1).reshape(N, K) - 32, d, np.zeros_like(d), 16


def _fma(level: str):  # a * b + c in float32 as the level's vfma rounds it
    if level == "portable":
        return lambda a, b, c: F32(a) * F32(b) + F32(c)
    return lambda a, b, c: (F64(a) * F64(b) + F64(c)).astype(F32)


def _float_kernel(x: np.ndarray, w: np.ndarray, fma) -> np.ndarray:  # [M, K] @ [N, K]^T, chains of KC k
    tot = None
    for k0 in range(0, x.shape[1], KC):
        acc = np.zeros((x.shape[0], w.shape[0]), F32)
        for k in range(k0, min(x.shape[1], k0 + KC)):
            acc = fma(x[:, k : k + 1], w[None, :, k], acc)
        tot = acc if tot is None else tot + acc
    return tot


def quantize_rows(x: np.ndarray, G: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The integer kernel's activations: per group of G, xq = round(x * 127 / amax) (half to even), dx =
    amax / 127, sx = sum(xq): xq [M, K] int64, dx and sx [M, K / G]."""
    g = x.reshape(x.shape[0], -1, G)
    amax = np.abs(g).max(-1)
    inv = np.where(amax > 0, F32(127) / np.where(amax > 0, amax, F32(1)), F32(0)).astype(F32)
    xq = np.clip(np.rint(g * inv[..., None]), -127, 127).astype(np.int64)
    return xq.reshape(x.shape), (amax / F32(127)).astype(F32), xq.sum(-1)


def _int_kernel(x: np.ndarray, q: np.ndarray, d: np.ndarray, m: np.ndarray, sub: int, G: int, fma) -> np.ndarray:
    xq, dx, sx = quantize_rows(x, G)
    t = np.zeros((x.shape[0], q.shape[0]), F32)
    for g in range(x.shape[1] // G):
        ks = slice(g * G, g * G + G)
        dot = (xq[:, ks] @ q[:, ks].T).astype(F32)  # exact integers
        ds, ms = d[:, g * G // sub], m[:, g * G // sub]  # [N]
        t = fma(dot, ds[None, :] * dx[:, g : g + 1], t)
        t = fma(ms[None, :], (dx[:, g] * sx[:, g].astype(F32))[:, None], t)
    return t


def model_product(parts: list[Blocks], x: torch.Tensor, level: str) -> torch.Tensor:
    """x [M, K] @ W^T [N, K] of stacked parts as the native product computes it at ``level``, bitwise."""
    fma, xs = _fma(level), x.numpy().astype(F32)
    formats = [b.format for b in parts]
    qint, G = int_kernel(level, formats), 16 if "Q6_K" in formats else 32
    out = []
    for b in parts:
        if b.format in FLOATS:
            out.append(_float_kernel(xs, b.dequantize().numpy(), fma))
            continue
        q, d, m, sub = codes_and_scales(b)
        if qint:
            out.append(_int_kernel(xs, q, d, m, sub, G, fma))
        else:
            w = fma(q.astype(F32), np.repeat(d, sub, 1), np.repeat(m, sub, 1))
            out.append(_float_kernel(xs, w, fma))
    return torch.from_numpy(np.concatenate(out, 1))
