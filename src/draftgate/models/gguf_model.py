"""A GGUF file as a model: its config from the metadata, its tokenizer, and its weights.

``--dtype auto`` (``quantized``): the weight matrices stay in the file, as views of its memory map
that the native kernels pack once (``gguf_blocks.read_blocks``); only norms, biases and RoPE factors
become float32 tensors. Any other dtype: every tensor dequantized to float32 once and cached as a
safetensors file (about a second to load again).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from draftgate.errors import ModelLoadError
from draftgate.models.config import ModelConfig, RopeScaling, family_of
from draftgate.models.gguf_blocks import hf_name, read_blocks, unpermute
from draftgate.models.gguf_file import GGUFFile, cache_file
from draftgate.models.tokenizer import TextTokenizer
from draftgate.models.weights import ModelWeights

__all__ = ["gguf_config", "load_gguf", "gguf_info", "dequantize_gguf"]


def load_gguf(path: Path, cache_dir: Path | None, quantized: bool) -> tuple[ModelConfig, ModelWeights, TextTokenizer]:
    """The config (tied or not, RoPE factors, eos ids from the tokenizer), weights and tokenizer of a file."""
    f = GGUFFile(path)
    config, tok = gguf_info(f)
    if quantized:
        dense = {}
        for t in f.tensors:
            if len(t.shape) < 2:  # norms, biases, RoPE factors
                key, _ = hf_name(t.name, config.family)
                dense[key] = torch.from_numpy(f.floats(t) if t.type_name in _FLOATS else _dequantize(f, t))
        blocks = read_blocks(f, config)
    else:
        dense, blocks = _float_weights(f, config, cache_dir), {}
    freq = dense.pop("rope_freqs", None)
    config = replace(
        config,
        tie_word_embeddings="lm_head.weight" not in dense and "lm_head.weight" not in blocks,
        rope_freq_factors=tuple(freq.tolist()) if freq is not None else None,
    )
    return config, ModelWeights(dense, blocks), tok


def gguf_info(f: GGUFFile) -> tuple[ModelConfig, TextTokenizer]:
    """Config and tokenizer from the metadata alone (no tensor is read)."""
    config = gguf_config(f.fields, f.path)  # an unsupported architecture is refused before anything else
    tok = TextTokenizer.from_gguf_fields(f.fields)
    return replace(config, eos_token_ids=tok.eos_ids), tok


_FLOATS = ("F32", "F16", "BF16")


def _dequantize(f: GGUFFile, t: Any) -> np.ndarray:
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    return np.ascontiguousarray(dequantize(f.data(t), GGMLQuantizationType(t.ggml_type)), dtype=np.float32)


def _float_weights(f: GGUFFile, config: ModelConfig, cache_dir: Path | None) -> dict[str, torch.Tensor]:
    """Every tensor as float32, cached (dequantizing SmolLM2-135M takes about 10 s, reading the cache 1)."""
    cached = cache_file(f.path, cache_dir, "v3", ".safetensors")
    if cached is not None and cached.is_file():
        return load_file(str(cached))
    weights = dequantize_gguf(f, config)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        save_file(weights, str(tmp))
        tmp.replace(cached)
    return weights


# llama.cpp's conventions where a GGUF file does not say: Gemma 3's sliding window covers five of every
# six layers, with a RoPE base of 10000 there (llama.cpp: set_swa_pattern(6), rope_freq_base_train_swa).
_GGUF_SWA_PATTERN = {"gemma3": 6}
_GGUF_SWA_ROPE_BASE = {"gemma3": 10000.0}


def gguf_config(fields: dict[str, Any], path: Path) -> ModelConfig:
    arch = str(fields.get("general.architecture"))
    try:
        fam = family_of(arch, str(path))
    except ValueError as e:
        raise ModelLoadError(str(e)) from None
    a = arch + "."
    heads = int(fields[a + "attention.head_count"])
    hidden = int(fields[a + "embedding_length"])
    layers = int(fields[a + "block_count"])
    vocab = len(fields.get("tokenizer.ggml.tokens", ()))
    eos = fields.get("tokenizer.ggml.eos_token_id")
    eot = fields.get("tokenizer.ggml.eot_token_id")
    head_dim = int(fields.get(a + "attention.key_length") or fields.get(a + "rope.dimension_count") or hidden // heads)
    window = int(fields.get(a + "attention.sliding_window") or 0)
    pattern = int(fields.get(a + "attention.sliding_window_pattern") or _GGUF_SWA_PATTERN.get(arch, 1))
    windows = tuple(window if (i + 1) % pattern else 0 for i in range(layers)) if window and pattern > 1 else ()
    local_base = fields.get(a + "rope.freq_base_swa") or _GGUF_SWA_ROPE_BASE.get(arch)
    scaling = fields.get(a + "rope.scaling.type")
    if scaling not in (None, "none", "linear"):
        raise ModelLoadError(f"{path}: RoPE scaling {scaling!r} is not supported (linear, or llama3's rope_freqs)")
    factor = float(fields.get(a + "rope.scaling.factor") or 1.0)
    # Gemma 3 27B scales attention by its hidden size per head, the others by the head width (llama.cpp).
    scale = (hidden / heads) ** -0.5 if arch == "gemma3" and layers == 62 else None
    return ModelConfig(
        vocab_size=int(fields.get(a + "vocab_size", vocab)),
        hidden_size=hidden,
        intermediate_size=int(fields[a + "feed_forward_length"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(fields.get(a + "attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_norm_eps=float(fields.get(a + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(fields.get(a + "rope.freq_base", 10000.0)),
        rope_scaling=RopeScaling("linear", factor) if scaling == "linear" and factor != 1.0 else None,
        max_position_embeddings=int(fields.get(a + "context_length", 2048)),
        tie_word_embeddings=True,  # corrected below when an output tensor exists
        bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(int(e) for e in (eos, eot) if e is not None),
        family=fam,
        layer_windows=windows if any(windows) else (),
        rope_local_theta=float(local_base) if local_base and any(windows) else None,
        attn_scale=scale,
    )


def dequantize_gguf(f: GGUFFile, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Every tensor of the file as float32 under its runner name (q/k rows unpermuted)."""
    weights: dict[str, torch.Tensor] = {}
    for t in f.tensors:
        arr = (f.floats(t) if t.type_name in _FLOATS else _dequantize(f, t)).reshape(t.shape)
        key, perm = hf_name(t.name, config.family)
        if perm is not None:
            arr = unpermute(arr, config.num_heads if perm == "q" else config.num_kv_heads)
        weights[key] = torch.from_numpy(np.ascontiguousarray(arr))
    return weights
