"""Tiny random models of every supported family, built with transformers' own classes, saved as an HF
folder and as a GGUF file written the way llama.cpp's converter writes one (its tensor names and
metadata, q/k rows permuted for its llama architecture, Gemma's norms stored as 1 + w)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from draftgate.models.config import HF_MODEL_TYPES

# family -> (transformers class, config class, config kwargs beyond the shared ones)
SHARED: dict[str, Any] = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
)
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(num_hidden_layers=2, tie_word_embeddings=False)),
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(num_hidden_layers=2, sliding_window=None)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(num_hidden_layers=2, rope_theta=1000000.0)),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(num_hidden_layers=2, tie_word_embeddings=True)),
    # Sliding windows of 8 positions, shorter than the test prompts: layers 0-4 local, layer 5 global.
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(num_hidden_layers=6, sliding_window=8)),
}
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3"}


def build_hf(family: str, folder: Path, seed: int = 0) -> Path:
    """A random ``family`` model saved as an HF folder with the tiny tokenizer (tests/conftest.py)."""
    import transformers

    from tiny_support import write_tiny_tokenizer

    cls_name, cfg_name, extra = FAMILIES[family]
    cfg = getattr(transformers, cfg_name)(**{**SHARED, **extra})
    torch.manual_seed(seed)
    hf = getattr(transformers, cls_name)(cfg).float()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.ndim == 2:  # HF's std 0.02 gives near-flat logits: widen so argmax never ties
                p.normal_(0.0, 0.15)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.3)
            elif family == "gemma3":  # Gemma multiplies by 1 + w: w around 0
                p.uniform_(-0.5, 0.5)
            else:  # norm weights != 1 so a dropped or misplaced norm shows up
                p.uniform_(0.5, 1.5)
    folder.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(folder, safe_serialization=True)
    write_tiny_tokenizer(folder)
    return folder


def hf_reference(folder: Path) -> Any:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()


# transformers' names (after "model.layers.{i}.") -> llama.cpp's, per family where they differ.
_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
}
_POST_ATTENTION = {"gemma3": "post_attention_norm"}  # Gemma's is after the attention, Llama's before the MLP
_GEMMA_EXTRA = {"pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's q/k row permutation (its llama arch interleaves RoPE halves)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(family: str, folder: Path, path: Path, quant: str | None = None) -> Path:
    """The HF folder's model as a GGUF file (F32 tensors; ``quant`` "Q8_0": its 2-D weights in Q8_0)."""
    import gguf
    from safetensors.torch import load_file

    from draftgate.models.loader import _hf_config_and_tokenizer

    cfg, _, files = _hf_config_and_tokenizer(folder)
    assert HF_MODEL_TYPES.get(_model_type(folder)) == family
    arch = GGUF_ARCH[family]
    w = {k: v.float().numpy() for f in files for k, v in load_file(str(f)).items()}
    wr = gguf.GGUFWriter(str(path), arch)
    wr.add_context_length(cfg.max_position_embeddings)
    wr.add_embedding_length(cfg.hidden_size)
    wr.add_block_count(cfg.num_layers)
    wr.add_feed_forward_length(cfg.intermediate_size)
    wr.add_head_count(cfg.num_heads)
    wr.add_head_count_kv(cfg.num_kv_heads)
    wr.add_key_length(cfg.head_dim)
    wr.add_value_length(cfg.head_dim)
    wr.add_rope_dimension_count(cfg.head_dim)
    wr.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    wr.add_rope_freq_base(cfg.rope_theta)
    if family == "gemma3":
        wr.add_sliding_window(max(cfg.layer_windows))
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    words = sorted(vocab, key=vocab.get)
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("gpt-2")
    wr.add_token_list(words)
    wr.add_token_merges(["a n"])  # one merge ("an" is a word of the tiny vocabulary)
    wr.add_token_types([gguf.TokenType.CONTROL if i < 3 else gguf.TokenType.NORMAL for i in range(len(words))])
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)
    offset = 1.0 if family == "gemma3" else 0.0  # llama.cpp writes Gemma's norms as 1 + w
    for name, arr in w.items():
        out, data = _gguf_name(family, name), arr
        if out is None:
            continue
        if family in ("llama", "mistral") and out.endswith(("attn_q.weight", "attn_k.weight")):
            data = _permute(arr, cfg.num_heads if "attn_q" in out else cfg.num_kv_heads)
        if offset and out.endswith("norm.weight"):
            data = arr + offset
        if quant == "Q8_0" and data.ndim == 2 and data.shape[1] % 32 == 0:
            q = gguf.quants.quantize(np.ascontiguousarray(data, dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
            wr.add_tensor(out, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            wr.add_tensor(out, np.ascontiguousarray(data, dtype=np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


def _model_type(folder: Path) -> str:
    return json.loads((folder / "config.json").read_text())["model_type"]


def _gguf_name(family: str, name: str) -> str | None:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    _, _, i, rest = name.split(".", 3)
    part, kind = rest.rsplit(".", 1)
    if part == "post_attention_layernorm":
        g = _POST_ATTENTION.get(family, "ffn_norm")
    elif part in _GEMMA_EXTRA:
        g = _GEMMA_EXTRA[part]
    else:
        g = _LAYER_NAMES[part]
    return f"blk.{i}.{g}.{kind}"


def noisy_copy(folder: Path, out: Path, scale: float = 0.05, seed: int = 1) -> Path:
    """A draft for the model in ``folder``: its weights plus noise, same tokenizer (agrees often, not always)."""
    import shutil

    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    g = torch.Generator().manual_seed(seed)
    for f in folder.glob("*.safetensors"):
        w = load_file(str(f))
        noisy = {k: v + torch.randn(v.shape, generator=g) * scale if v.ndim == 2 else v for k, v in w.items()}
        save_file(noisy, str(out / f.name), metadata={"format": "pt"})
    return out
