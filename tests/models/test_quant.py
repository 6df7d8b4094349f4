"""Quantized weights on the native kernels: GGUF's blocks decoded as gguf decodes them, products
bitwise the same at every row count in every format and at every instruction-set level.

The reference for decoding is the ``gguf`` package's own dequantization of the same bytes; the
reference for invariance is the one-row product, compared with torch.equal.

The integer kernel (every tile with AVX-512 VNNI, 4-bit tiles with AVX-512 or AVX2) quantizes each
row's activations to 8 bits per group and multiplies in integers; the others multiply float
activations by dequantized weights.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from levels_support import skip_unless_here

from draftgate.models import native
from draftgate.models.gguf_blocks import BLOCK_LAYOUT, GGML_TYPES, Blocks, quantize
from draftgate.models.native import LEVELS

FORMATS = list(GGML_TYPES)  # Q4_0, Q4_1, Q8_0, Q4_K, Q6_K
# Where each block keeps its float16 fields (random bytes there could be NaN or huge).
_F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2], "Q6_K": [208]}


def random_blocks(fmt: str, N: int, K: int, seed: int = 0) -> Blocks:
    """Random codes and scales in GGML's layout of ``fmt`` (the scales sane float16 values)."""
    per, nbytes = BLOCK_LAYOUT[fmt]
    g = np.random.default_rng(seed)
    raw = g.integers(0, 256, size=(N, K // per, nbytes), dtype=np.uint8)
    for off in _F16_FIELDS[fmt]:
        scale = g.uniform(0.001, 0.05, size=(N, K // per)).astype(np.float16)
        raw[:, :, off : off + 2] = scale.view(np.uint8).reshape(N, K // per, 2)
    return Blocks(fmt, torch.from_numpy(raw.reshape(N, -1).copy()), K)


class Packed:
    """One packed product on a library: y = x @ W^T, and W as the kernels see it."""

    def __init__(self, lib: native.NativeLib, parts: list[Blocks]) -> None:
        c = lib.cdll
        self.c, self.N, self.K = c, sum(b.N for b in parts), parts[0].K
        self._data = [b.data.contiguous() for b in parts]
        ptrs = (ctypes.c_void_p * len(parts))(*[d.data_ptr() for d in self._data])
        types = (ctypes.c_int * len(parts))(*[b.ggml_type for b in parts])
        rows = (ctypes.c_int * len(parts))(*[b.N for b in parts])
        self.h = c.dg_pack_gguf(len(parts), ptrs, types, rows, self.K)
        assert self.h, c.dg_last_error().decode()

    def weights(self) -> torch.Tensor:  # [N, K]
        out = torch.empty(self.N, self.K)
        assert self.c.dg_unpack(self.h, out.data_ptr()) == 0
        return out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N]
        x = x.contiguous()
        y = torch.empty(x.shape[0], self.N)
        assert self.c.dg_linear(self.h, x.data_ptr(), x.shape[0], y.data_ptr(), 0) == 0
        return y

    def __del__(self) -> None:
        self.c.dg_packed_free(self.h)


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> native.NativeLib:
    return native.load_library(tmp_path_factory.mktemp("native"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_decodes_as_gguf_does(lib: native.NativeLib, fmt: str) -> None:
    b = random_blocks(fmt, N=37, K=512)  # 37 rows: a padded last column vector
    got, ref = Packed(lib, [b]).weights(), b.dequantize()
    assert torch.allclose(got, ref, rtol=1e-6, atol=1e-7), (got - ref).abs().max()


def test_stacked_formats_decode_each_part(lib: native.NativeLib) -> None:
    """q, k, v in different formats (as llama.cpp's mixed quantizations store them) pack into one product."""
    parts = [random_blocks("Q4_K", 48, 256, 1), random_blocks("Q6_K", 16, 256, 2), random_blocks("Q8_0", 16, 256, 3)]
    got = Packed(lib, parts).weights()
    assert torch.allclose(got, torch.cat([b.dequantize() for b in parts]), rtol=1e-6, atol=1e-7)


def test_unsupported_format_is_refused_with_its_name(lib: native.NativeLib) -> None:
    data = torch.zeros(4, 22, dtype=torch.uint8)
    ptrs = (ctypes.c_void_p * 1)(data.data_ptr())
    assert not lib.cdll.dg_pack_gguf(1, ptrs, (ctypes.c_int * 1)(6), (ctypes.c_int * 1)(4), 32)  # Q5_0
    assert "unsupported GGML type 6" in lib.cdll.dg_last_error().decode()


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_quantize_rounds_each_weight_to_its_block_grid(fmt: str) -> None:
    w = torch.randn(64, 256) * 0.05
    back = quantize(w, fmt).dequantize()
    blocks = w.reshape(64, 8, 32)
    step = (blocks.amax(-1) - blocks.amin(-1)) / 15 if fmt == "q4_1" else blocks.abs().amax(-1) / 127
    err = (back - w).abs().reshape(64, 8, 32).amax(-1)
    assert (err <= step * 0.51 + 1e-4).all()


def quantize_rows(x: torch.Tensor, G: int) -> torch.Tensor:
    """x as the integer kernel sees it: per group of G, dx * round(x * 127 / amax) (half to even)."""
    g = x.reshape(x.shape[0], -1, G)
    amax = g.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(g * inv).clamp(-127, 127) * (amax / 127.0)).reshape(x.shape)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("fmt", [*FORMATS, "mixed"])
def test_products_are_batch_invariant_in_every_format_and_level(level: str, fmt: str, tmp_path) -> None:
    """Row i of an M-row product is bitwise row i alone, M = 1..17, and x @ W^T to float32 rounding
    (with x in 8 bits per group on the integer kernel, as llama.cpp multiplies)."""
    skip_unless_here(level)
    lib = native.load_library(tmp_path, level=level)
    K = 768  # 24 groups of 32: three KC chunks
    if fmt == "mixed":
        parts = [random_blocks("Q4_1", 40, K, 4), random_blocks("Q6_K", 33, K, 5)]
    else:
        parts = [random_blocks(fmt, 75, K, 6)]
    p = Packed(lib, parts)
    x = torch.randn(17, K, generator=torch.Generator().manual_seed(7))
    alone = torch.cat([p(x[i : i + 1]) for i in range(17)])
    for m in range(1, 18):
        got = p(x[:m])
        bad = [i for i in range(m) if not torch.equal(got[i], alone[i])]
        assert not bad, f"{fmt} at {level}: rows {bad} of a {m}-row product differ from one-row products"
    w, xs = p.weights().double(), x
    four_bit = fmt in ("Q4_0", "Q4_1", "Q4_K")  # packed as Q4 tiles; the others as Q8 tiles
    if level == "avx512vnni" or (four_bit and level != "portable"):  # the integer kernel: x in 8 bits a group
        xs = quantize_rows(x, 16 if fmt in ("Q6_K", "mixed") else 32)
    ref, scale = xs.double() @ w.T, xs.double().abs() @ w.abs().T  # the exact product and its rounding scale
    assert ((alone.double() - ref).abs() <= 1e-5 * scale).all()


def test_the_invariance_check_sees_a_changed_product(lib: native.NativeLib) -> None:
    """The bitwise comparison above is not vacuous: a product over other codes differs."""
    a, b = Packed(lib, [random_blocks("Q4_1", 16, 256, 8)]), Packed(lib, [random_blocks("Q4_1", 16, 256, 9)])
    x = torch.randn(1, 256)
    assert not torch.equal(a(x), b(x))


@pytest.mark.real_model
def test_the_bundled_models_own_blocks_agree_with_its_float32_weights(real_model) -> None:  # type: ignore[no-untyped-def]
    """SmolLM2's Q4_1/Q8_0 blocks as the kernels run them (rows unpermuted as the float loader does) give
    the float32 dequantization's predictions: a wrong layout or permutation would give noise."""
    from dataclasses import replace
    from pathlib import Path

    from draftgate.models.gguf_blocks import load_blocks
    from draftgate.models.runner import ForwardItem, ModelRunner

    c, cache = real_model.config, Path(__file__).resolve().parents[2] / ".cache" / "models"
    quant = replace(real_model, blocks=load_blocks(real_model.gguf_path, c.num_heads, c.num_kv_heads, cache))
    ids = real_model.tokenizer.encode_chat([{"role": "user", "content": "Explain how a rainbow forms, briefly."}])
    ids += real_model.tokenizer.encode(" A rainbow forms when sunlight enters raindrops and is bent, then reflected.")
    logits = []
    for model in (real_model, quant):
        runner = ModelRunner(model, num_blocks=16, enable_prefix_cache=False)
        runner.prefill(1, ids[:1])
        (lg,) = runner.forward([ForwardItem(1, ids[1:], num_logits=len(ids) - 1)])  # [n - 1, V]
        logits.append(lg)
    same = (logits[0].argmax(-1) == logits[1].argmax(-1)).float().mean().item()
    assert same >= 0.9, f"top-1 agreement {same:.2f}"
    assert (logits[0] - logits[1]).abs().mean().item() < 0.5
