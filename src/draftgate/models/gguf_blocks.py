"""GGUF weights as GGUF stores them: quantized blocks, for the native kernels to run as they are.

A ``Blocks`` is one weight matrix [N, K] in a GGML format (rows of ``row_bytes`` bytes): a block
format, or a float type (F32, F16, BF16: blocks of one weight). The native packer
(``models/native/qgemm.h``) reads every format of ``GGML_TYPES``; a file with a weight matrix in any
other (IQ*, Q2_K, Q3_K, TQ*, ...) is refused by ``read_blocks``, naming it. ``quantize`` makes Q4_1
or Q8_0 blocks from float weights (the quantized self-draft of a float target).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from draftgate.errors import ModelLoadError
from draftgate.models.config import Family, ModelConfig
from draftgate.models.gguf_file import GGUFFile, GGUFTensor

__all__ = [
    "Blocks",
    "BLOCK_LAYOUT",
    "GGML_TYPES",
    "QUANT_FORMATS",
    "hf_name",
    "unpermute",
    "read_blocks",
    "load_blocks",
    "quantize",
]

# ggml type ids of the formats the native packer reads (models/native/gguf_decode.h), and (weights, bytes)
# per block (gguf's GGML_QUANT_SIZES). The float types run on the float kernel from their own storage.
GGML_TYPES = {
    "Q4_0": 2,
    "Q4_1": 3,
    "Q5_0": 6,
    "Q5_1": 7,
    "Q8_0": 8,
    "Q4_K": 12,
    "Q5_K": 13,
    "Q6_K": 14,
    "F32": 0,
    "F16": 1,
    "BF16": 30,
}
BLOCK_LAYOUT = {
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
}
QUANT_FORMATS = ("q4_1", "q8_0")  # what ``quantize`` makes

_GGUF_NAMES = {  # llama.cpp's tensor names -> the runner's (HF Llama's, plus the norms other families add)
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "self_attn.o_norm",
    "post_ffw_norm": "mlp.down_norm",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
    "rope_freqs.weight": "rope_freqs",
}


def hf_name(name: str, family: Family) -> tuple[str, str | None]:
    """A GGUF tensor's runner name, and which head count undoes its RoPE row permutation ("q", "k" or None:
    only families whose GGUF rows llama.cpp's converter permuted)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name], None
    if name.startswith("blk."):
        _, i, part, kind = name.split(".", 3)
        if part in _GGUF_NAMES and kind in ("weight", "bias"):
            perm = {"attn_q": "q", "attn_k": "k"}.get(part) if family.gguf_permuted_qk else None
            return f"model.layers.{i}.{_GGUF_NAMES[part]}.{kind}", perm
    raise ModelLoadError(f"unexpected tensor {name} in a {family.name} GGUF file: DraftGate does not read it")


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's converter permutation of Q/K rows (it interleaves RoPE halves); rows stay whole."""
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


@dataclass(frozen=True)
class Blocks:
    """One weight [N, K] in a GGML format: ``data`` uint8 [N, row_bytes]."""

    format: str  # "Q4_1", "Q5_K", "F16", ...
    stored: torch.Tensor  # uint8 [N, row_bytes], rows in the file's order
    K: int
    # The file and tensor ``stored`` is a view of (None: its own memory), for ``release``.
    source: tuple[GGUFFile, GGUFTensor] | None = field(default=None, repr=False, compare=False)
    # q/k rows llama.cpp's converter permuted: the head count that undoes it (None: rows as they are).
    heads: int | None = None

    @property
    def data(self) -> torch.Tensor:
        """uint8 [N, row_bytes] in the runner's row order: ``stored``, or a copy with q/k rows unpermuted
        (made on each access, so no unpermuted copy outlives its use)."""
        if self.heads is None:
            return self.stored
        return torch.from_numpy(np.ascontiguousarray(unpermute(self.stored.numpy(), self.heads)))

    def release(self) -> None:
        """Hand a file view's pages back once packed (``stored`` stays valid: touched again, it is read again)."""
        if self.source is not None:
            self.source[0].release(self.source[1])

    @property
    def N(self) -> int:
        return int(self.stored.shape[0])

    @property
    def ggml_type(self) -> int:
        return GGML_TYPES[self.format]

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K] (gguf's reference dequantization)."""
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize

        arr = dequantize(self.data.numpy(), GGMLQuantizationType[self.format])
        return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)).reshape(self.N, self.K)


def read_blocks(f: GGUFFile, cfg: ModelConfig) -> dict[str, Blocks]:
    """The weight matrices of an open GGUF file by runner name: views of its memory map (q/k rows llama.cpp's
    converter permuted are unpermuted when read); a format the packer does not read is refused."""
    out: dict[str, Blocks] = {}
    for t in f.tensors:
        if len(t.shape) < 2:  # norms, biases, RoPE factors: the loader reads them as floats
            continue
        fmt = t.type_name
        if fmt not in GGML_TYPES:
            raise ModelLoadError(
                f"GGUF tensor {t.name} is stored as {fmt}, which the native kernels do not read; "
                f"they read {', '.join(GGML_TYPES)} (requantize the model to one of these)"
            )
        key, perm = hf_name(t.name, cfg.family)
        heads = None if perm is None else cfg.num_heads if perm == "q" else cfg.num_kv_heads
        out[key] = Blocks(fmt, torch.from_numpy(f.data(t)), t.shape[-1], (f, t), heads)  # [N, row_bytes]
    return out


def load_blocks(path: Path, cfg: ModelConfig) -> dict[str, Blocks]:
    """``read_blocks`` of the GGUF file at ``path``."""
    return read_blocks(GGUFFile(path), cfg)


def _f16_bytes(x: torch.Tensor) -> torch.Tensor:  # [..., 1] float16 -> [..., 2] uint8 (little endian)
    return x.contiguous().view(torch.uint8)


def quantize(w: torch.Tensor, fmt: str) -> Blocks:
    """Float weights [N, K] (K a multiple of 32) as ``q4_1`` or ``q8_0`` blocks (ggml's layouts)."""
    if fmt not in QUANT_FORMATS:
        raise ValueError(f"quantize makes {QUANT_FORMATS}, not {fmt!r}")
    N, K = w.shape
    if K % 32:
        raise ValueError(f"quantizing needs rows of a multiple of 32 weights, not {K}")
    x = w.detach().to(torch.float32).reshape(N, K // 32, 32)  # [N, B, 32]
    if fmt == "q8_0":
        d = (x.abs().amax(-1, keepdim=True) / 127).to(torch.float16)  # [N, B, 1]
        df = d.to(torch.float32)
        q = torch.where(df > 0, torch.round(x / torch.where(df > 0, df, 1)), 0).clamp(-127, 127).to(torch.int8)
        data = torch.cat([_f16_bytes(d), q.view(torch.uint8)], -1)  # [N, B, 34]
        return Blocks("Q8_0", data.reshape(N, -1).contiguous(), K)
    lo, hi = x.amin(-1, keepdim=True), x.amax(-1, keepdim=True)
    d, m = ((hi - lo) / 15).to(torch.float16), lo.to(torch.float16)  # [N, B, 1] each
    df, mf = d.to(torch.float32), m.to(torch.float32)
    q = torch.where(df > 0, torch.round((x - mf) / torch.where(df > 0, df, 1)), 0).clamp(0, 15).to(torch.uint8)
    packed = q[..., :16] | (q[..., 16:] << 4)  # [N, B, 16]: weight j low nibble, j + 16 high
    data = torch.cat([_f16_bytes(d), _f16_bytes(m), packed], -1)  # [N, B, 20]
    return Blocks("Q4_1", data.reshape(N, -1).contiguous(), K)
