"""GGUF weights as GGUF stores them: quantized blocks, for the native kernels to run as they are.

A ``Blocks`` is one weight matrix [N, K] in a GGML block format (rows of ``row_bytes`` bytes).
The native packer (``models/native/qgemm.h``) reads Q4_0, Q4_1, Q8_0, Q4_K and Q6_K; a weight in
any other format is run from its dequantized float32 copy instead. ``quantize`` makes Q4_1 or
Q8_0 blocks from float weights (the quantized self-draft of a float target).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from draftgate.errors import ModelLoadError
from draftgate.models.gguf_file import cache_file, open_gguf

__all__ = [
    "Blocks",
    "BLOCK_LAYOUT",
    "GGML_TYPES",
    "LAYER_WEIGHTS",
    "QUANT_FORMATS",
    "hf_name",
    "unpermute",
    "read_blocks",
    "load_blocks",
    "quantize",
]

# ggml type ids of the formats the native packer reads, and (weights, bytes) per block.
GGML_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
BLOCK_LAYOUT = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q8_0": (32, 34), "Q4_K": (256, 144), "Q6_K": (256, 210)}
QUANT_FORMATS = ("q4_1", "q8_0")  # what ``quantize`` makes

_GGUF_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
LAYER_WEIGHTS = tuple(_GGUF_NAMES.values())  # every layer's weights, HF names without "model.layers.{i}."
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
    "rope_freqs.weight": "rope_freqs",
}


def hf_name(name: str) -> tuple[str, str | None]:
    """A GGUF tensor's HF name, and which head count undoes its RoPE row permutation ("q", "k" or None)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name], None
    if name.startswith("blk."):
        _, i, part, _ = name.split(".", 3)
        if part in _GGUF_NAMES:
            return f"model.layers.{i}.{_GGUF_NAMES[part]}.weight", {"attn_q": "q", "attn_k": "k"}.get(part)
    raise ModelLoadError(f"unexpected tensor {name} in GGUF file")


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's converter permutation of Q/K rows (it interleaves RoPE halves); rows stay whole."""
    rows, cols = w.shape
    return w.reshape(n_head, rows // n_head // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


@dataclass(frozen=True)
class Blocks:
    """One weight [N, K] in a GGML block format: ``data`` uint8 [N, row_bytes]."""

    format: str  # "Q4_1", ...
    data: torch.Tensor
    K: int

    @property
    def N(self) -> int:
        return int(self.data.shape[0])

    @property
    def ggml_type(self) -> int:
        return GGML_TYPES[self.format]

    def dequantize(self) -> torch.Tensor:
        """float32 [N, K] (gguf's reference dequantization)."""
        from gguf.constants import GGMLQuantizationType
        from gguf.quants import dequantize

        arr = dequantize(self.data.numpy(), GGMLQuantizationType[self.format])
        return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32)).reshape(self.N, self.K)


def read_blocks(reader: Any, num_heads: int, num_kv_heads: int) -> dict[str, Blocks]:
    """The weights of an open GGUF file that are in a format the packer reads, by HF name."""
    out: dict[str, Blocks] = {}
    for t in reader.tensors:
        fmt = t.tensor_type.name
        if fmt not in GGML_TYPES:
            continue
        key, perm = hf_name(t.name)
        arr = np.asarray(t.data)  # [N, row_bytes] uint8
        if perm is not None:
            arr = unpermute(arr, num_heads if perm == "q" else num_kv_heads)
        out[key] = Blocks(fmt, torch.from_numpy(np.array(arr, dtype=np.uint8, copy=True)), int(t.shape[0]))
    return out


def load_blocks(path: Path, num_heads: int, num_kv_heads: int, cache_dir: Path | None) -> dict[str, Blocks]:
    """``read_blocks`` of a GGUF file, cached as uint8 safetensors (parsing GGUF metadata takes ~10 s)."""
    cached = cache_file(path, cache_dir, "blocks-v1", ".blocks.safetensors")
    if cached is not None and cached.is_file():
        with safe_open(str(cached), framework="pt") as f:
            meta = json.loads((f.metadata() or {})["blocks"])
            return {k: Blocks(meta[k][0], f.get_tensor(k), int(meta[k][1])) for k in f.keys()}
    blocks = read_blocks(open_gguf(path), num_heads, num_kv_heads)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        meta = json.dumps({k: [b.format, b.K] for k, b in blocks.items()})
        save_file({k: b.data.contiguous() for k, b in blocks.items()}, str(tmp), metadata={"blocks": meta})
        tmp.replace(cached)
    return blocks


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
