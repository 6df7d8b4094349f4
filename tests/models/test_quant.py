"""GGUF's tensors on the native kernels: its blocks decoded as gguf decodes them, each format (and each
part of a stack) packed in about the file's own bytes, its float types (F32, F16, BF16) run from their
own storage, products bitwise the same at every row count and bitwise what the kernel model of each
instruction-set level computes (kernel_model.py), and any other type refused by name.

The reference for decoding is the ``gguf`` package's own dequantization of the same bytes; the
reference for invariance is the one-row product, compared with torch.equal.

The integer kernel (every quantized product with AVX-512 VNNI, products of 4- and 5-bit codes with
AVX-512 or AVX2) quantizes each row's activations to 8 bits per group and multiplies in integers; the
other quantized products multiply float activations by dequantized weights, and float parts run the
float kernel.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
import torch
from kernel_model import BITS, int_kernel, model_product, quantize_rows
from levels_support import skip_unless_here

from draftgate.models import native
from draftgate.models.gguf_blocks import BLOCK_LAYOUT, GGML_TYPES, Blocks, quantize
from draftgate.models.loader import LoadedModel
from draftgate.models.native import LEVELS

FORMATS = list(GGML_TYPES)  # Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F32, F16, BF16
# Where each block keeps its float16 fields (random bytes there could be NaN or huge).
_F16_FIELDS = {
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
}
_FLOATS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# Stacks of parts in different formats (q, k, v as llama.cpp's mixed quantizations store them:
# Q4_K_M and Q5_K_M keep attn_v in Q6_K, small models some tensors in Q5_0 or Q8_0).
STACKS = {
    "Q4_1+Q6_K": ["Q4_1", "Q6_K"],
    "Q5_K+Q4_K+Q6_K": ["Q5_K", "Q4_K", "Q6_K"],
    "Q5_K+Q4_K": ["Q5_K", "Q4_K"],
    "Q5_0+Q5_1+Q4_0": ["Q5_0", "Q5_1", "Q4_0"],
    "Q5_0+Q8_0": ["Q5_0", "Q8_0"],
    "Q4_K+Q6_K+Q4_K": ["Q4_K", "Q6_K", "Q4_K"],
    "Q8_0+Q4_0+Q4_0": ["Q8_0", "Q4_0", "Q4_0"],
    "F16+BF16": ["F16", "BF16"],
    "F16+Q8_0": ["F16", "Q8_0"],
    "BF16+Q4_K+F32": ["BF16", "Q4_K", "F32"],
}


def random_blocks(fmt: str, N: int, K: int, seed: int = 0) -> Blocks:
    """Random codes and scales in GGML's layout of ``fmt`` (the scales sane float16 values); for a
    float type, random weights in it."""
    per, nbytes = BLOCK_LAYOUT[fmt]
    g = np.random.default_rng(seed)
    if fmt in _FLOATS:
        w = torch.from_numpy(g.standard_normal((N, K), dtype=np.float32) * 0.05).to(_FLOATS[fmt])
        return Blocks(fmt, w.view(torch.uint8).reshape(N, K * nbytes).clone(), K)
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


def test_the_format_tables_are_ggufs() -> None:
    """Each format's type id and (weights, bytes) per block are those of the installed gguf package."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    for fmt, type_id in GGML_TYPES.items():
        assert GGMLQuantizationType(type_id).name == fmt
        assert GGML_QUANT_SIZES[GGMLQuantizationType(type_id)] == BLOCK_LAYOUT[fmt], fmt


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_decodes_as_gguf_does(lib: native.NativeLib, fmt: str) -> None:
    """The weights the kernels multiply are bitwise gguf's numpy dequantization of the same bytes."""
    b = random_blocks(fmt, N=37, K=512)  # 37 rows: a padded last column vector
    got, ref = Packed(lib, [b]).weights(), b.dequantize()
    assert torch.equal(got, ref), (got - ref).abs().max()


@pytest.mark.parametrize("stack", list(STACKS))
def test_stacked_formats_decode_each_part(lib: native.NativeLib, stack: str) -> None:
    """q, k, v in different formats pack into one product, each part's rows decoded as its own format."""
    parts = [random_blocks(fmt, 16 * (i + 1), 256, i + 1) for i, fmt in enumerate(STACKS[stack])]
    got = Packed(lib, parts).weights()
    assert torch.equal(got, torch.cat([b.dequantize() for b in parts]))


_TILES = {0: "float32", 1: "bfloat16", 2: "float16", 3: "q4", 4: "q8", 5: "q5"}  # packed.h's DType
# Bytes a weight of each format's tiles (qtiles.h): the file's own fields, the K-quants' 6-bit scales
# and mins widened to a byte each.
PACKED_BYTES = {
    "Q4_0": 0.5625,
    "Q4_1": 0.625,
    "Q5_0": 0.6875,
    "Q5_1": 0.75,
    "Q8_0": 1.0625,
    "Q4_K": (2 + 2 + 16 + 128) / 256,
    "Q5_K": (2 + 2 + 16 + 160) / 256,
    "Q6_K": 210 / 256,
    "F32": 4.0,
    "F16": 2.0,
    "BF16": 2.0,
}


def reported_dtype(formats: list[str]) -> str:
    """What dg_packed_dtype reports for a stack: the class of its widest code (6 and 8 bits: q8), else
    the first part's float storage."""
    bits = max((BITS[f] for f in formats if f in BITS), default=0)
    if bits == 0:
        return {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[formats[0]]
    return "q4" if bits == 4 else "q5" if bits == 5 else "q8"


def test_every_format_packs_within_6_percent_of_its_files_bytes() -> None:
    for fmt, (per, nbytes) in BLOCK_LAYOUT.items():
        assert nbytes / per <= PACKED_BYTES[fmt] <= 1.06 * nbytes / per, fmt


@pytest.mark.parametrize("stack", [*FORMATS, *STACKS])
def test_each_part_of_a_stack_keeps_its_own_formats_bytes(lib: native.NativeLib, stack: str) -> None:
    """A stack's parts each pack in their own format's tiles (F16 and BF16 in their 16 bits, a K-quant
    beside a Q6_K as compact as alone): the product's bytes are the sum of its parts' own."""
    formats = STACKS.get(stack, [stack])
    parts = [random_blocks(fmt, 32, 256, i) for i, fmt in enumerate(formats)]  # 32 rows: whole tiles
    p = Packed(lib, parts)
    assert _TILES[lib.cdll.dg_packed_dtype(p.h)] == reported_dtype(formats)
    assert lib.cdll.dg_packed_bytes(p.h) == sum(b.N * b.K * PACKED_BYTES[b.format] for b in parts)


def test_unsupported_types_are_refused_with_their_names(lib: native.NativeLib) -> None:
    """Every other ggml type (IQ*, Q2_K, Q3_K, TQ*, ...) is refused by the packer, naming it and the
    types it reads."""
    from gguf.constants import GGMLQuantizationType

    data = torch.zeros(4, 1024, dtype=torch.uint8)
    ptrs = (ctypes.c_void_p * 1)(data.data_ptr())
    others = [t for t in GGMLQuantizationType if t.name not in GGML_TYPES]
    assert {"IQ2_XS", "Q2_K", "Q3_K", "TQ1_0"} <= {t.name for t in others}
    for t in others:
        assert not lib.cdll.dg_pack_gguf(1, ptrs, (ctypes.c_int * 1)(t.value), (ctypes.c_int * 1)(4), 256)
        msg = lib.cdll.dg_last_error().decode()
        assert f"unsupported GGML type {t.name} ({t.value})" in msg, msg
        assert set(msg.split("read ", 1)[1].split(", ")) == set(GGML_TYPES), msg


def test_a_gguf_file_with_another_type_is_refused_at_load(tmp_path: Path, tiny_model: LoadedModel) -> None:
    """read_blocks takes a file's F16 and BF16 matrices as they are stored, leaves 1-D tensors to the
    float loader, and refuses a matrix in a type the kernels do not read, naming the tensor and type."""
    import gguf

    from draftgate.errors import ModelLoadError
    from draftgate.models.gguf_blocks import read_blocks
    from draftgate.models.gguf_file import GGUFFile

    f16 = random_blocks("F16", 8, 64, 1)
    bf16 = random_blocks("BF16", 8, 64, 2)

    def write(path: Path, extra: bool) -> GGUFFile:
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_tensor("blk.0.ffn_up.weight", f16.data.view(torch.float16).numpy())
        w.add_tensor("blk.0.ffn_gate.weight", bf16.data.numpy(), raw_dtype=gguf.GGMLQuantizationType.BF16)
        w.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
        if extra:
            w.add_tensor(
                "blk.0.ffn_down.weight", np.zeros((8, 74), np.uint8), raw_dtype=gguf.GGMLQuantizationType.IQ2_XS
            )
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return GGUFFile(path)

    blocks = read_blocks(write(tmp_path / "ok.gguf", False), tiny_model.config)
    assert sorted(blocks) == ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"]
    for got, want in (
        (blocks["model.layers.0.mlp.up_proj.weight"], f16),
        (blocks["model.layers.0.mlp.gate_proj.weight"], bf16),
    ):
        assert (got.format, got.N, got.K) == (want.format, 8, 64) and torch.equal(got.data, want.data)
    with pytest.raises(ModelLoadError, match=r"blk\.0\.ffn_down\.weight is stored as IQ2_XS.*they read Q4_0, .*BF16"):
        read_blocks(write(tmp_path / "iq.gguf", True), tiny_model.config)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_quantize_rounds_each_weight_to_its_block_grid(fmt: str) -> None:
    w = torch.randn(64, 256) * 0.05
    back = quantize(w, fmt).dequantize()
    blocks = w.reshape(64, 8, 32)
    step = (blocks.amax(-1) - blocks.amin(-1)) / 15 if fmt == "q4_1" else blocks.abs().amax(-1) / 127
    err = (back - w).abs().reshape(64, 8, 32).amax(-1)
    assert (err <= step * 0.51 + 1e-4).all()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("fmt", [*FORMATS, *STACKS])
def test_products_are_batch_invariant_and_exactly_the_kernel_model(level: str, fmt: str, tmp_path) -> None:
    """Row i of an M-row product is bitwise row i alone, M = 1..17; bitwise what the level's kernel
    model computes (kernel_model.py: the integer kernel on 8-bit activations, or the float kernel, in
    the level's roundings); and x @ W^T to float32 rounding (with x in 8 bits a group on the integer kernel)."""
    skip_unless_here(level)
    lib = native.load_library(tmp_path, level=level)
    K = 768  # 24 groups of 32, three KC chunks, three K-quant blocks
    if fmt in STACKS:  # odd part sizes: segments of odd vector counts, narrow last tiles
        parts = [random_blocks(f, 40 - 7 * i, K, 4 + i) for i, f in enumerate(STACKS[fmt])]
    else:
        parts = [random_blocks(fmt, 75, K, 6)]
    p = Packed(lib, parts)
    x = torch.randn(17, K, generator=torch.Generator().manual_seed(7))
    alone = torch.cat([p(x[i : i + 1]) for i in range(17)])
    for m in range(1, 18):
        got = p(x[:m])
        bad = [i for i in range(m) if not torch.equal(got[i], alone[i])]
        assert not bad, f"{fmt} at {level}: rows {bad} of a {m}-row product differ from one-row products"
    model = model_product(parts, x, level)
    bad = (alone != model).any(0).nonzero().flatten().tolist()
    assert not bad, f"{fmt} at {level}: columns {bad} differ from the kernel model"
    formats = [b.format for b in parts]
    cols = np.cumsum([0, *[b.N for b in parts]])
    for b, c0, c1 in zip(parts, cols[:-1], cols[1:], strict=True):  # each part: x (8-bit on the integer kernel) @ W^T
        xs = x
        if b.format in BITS and int_kernel(level, formats):
            xq, dx, _ = quantize_rows(x.numpy(), 16 if "Q6_K" in formats else 32)
            xs = torch.from_numpy(xq * np.repeat(dx, xq.shape[1] // dx.shape[1], 1))
        w = p.weights()[c0:c1].double()
        ref, scale = xs.double() @ w.T, xs.double().abs() @ w.abs().T  # the exact product and its rounding scale
        assert ((alone[:, c0:c1].double() - ref).abs() <= 1e-5 * scale).all()


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

    from draftgate.models.gguf_blocks import load_blocks
    from draftgate.models.runner import ForwardItem, ModelRunner

    c = real_model.config
    quant = replace(real_model, blocks=load_blocks(real_model.gguf_path, c))
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
