"""Model shapes without weights: public shapes of every supported family by name, or read from a file.

Used by memory planning, where only the shape matters: ``resolve_shape`` takes a
named shape (``llama-3-70b``), an HF ``config.json`` (or the folder holding it),
or a ``.gguf`` file (metadata only; no tensor is read).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from draftgate.errors import ModelLoadError
from draftgate.models.config import FAMILIES, ModelConfig, RopeScaling

__all__ = ["NAMED_SHAPES", "resolve_shape"]

_L3_ROPE = 500000.0
_L31_SCALING = RopeScaling("llama3", factor=8.0, original_max_position=8192)
_L32_SCALING = RopeScaling("llama3", factor=32.0, original_max_position=8192)


def _llama3(
    hidden: int,
    inter: int,
    layers: int,
    heads: int,
    head_dim: int,
    *,
    ctx: int,
    scaling: RopeScaling | None,
    tied: bool,
) -> ModelConfig:
    """Every Llama 3.x: vocabulary 128256, 8 KV heads, bos 128000."""
    return ModelConfig(
        vocab_size=128256,
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=8,
        head_dim=head_dim,
        rope_theta=_L3_ROPE,
        rope_scaling=scaling,
        max_position_embeddings=ctx,
        tie_word_embeddings=tied,
        bos_token_id=128000,
    )


def _smollm2(hidden: int, inter: int, layers: int, heads: int, kv_heads: int, rope: float) -> ModelConfig:
    """SmolLM2: vocabulary 49152, head_dim 64, tied embeddings, 8k context."""
    return ModelConfig(
        vocab_size=49152,
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=64,
        rope_theta=rope,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_ids=(2,),
    )


def _qwen(hidden: int, inter: int, layers: int, heads: int, kv: int, *, qwen3: bool, tied: bool) -> ModelConfig:
    """Qwen 2.5 (q/k/v biases, head_dim hidden/heads) and Qwen 3 (q/k norms, head_dim 128): RoPE base 1e6."""
    return ModelConfig(
        vocab_size=152064 if (not qwen3 and not tied) else 151936,
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=128 if qwen3 else hidden // heads,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=40960 if qwen3 else 32768,
        tie_word_embeddings=tied,
        family=FAMILIES["qwen3" if qwen3 else "qwen2"],
    )


def _gemma3(hidden: int, inter: int, layers: int, heads: int, kv: int) -> ModelConfig:
    """Gemma 3 text models: vocabulary 262144, head_dim 256, windows of 512 on five layers of six."""
    return ModelConfig(
        vocab_size=262144,
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=256,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=2,
        family=FAMILIES["gemma3"],
        layer_windows=tuple(0 if (i + 1) % 6 == 0 else 512 for i in range(layers)),
        rope_local_theta=10000.0,
    )


# The public config.json of each model (meta-llama/*, HuggingFaceTB/SmolLM2-*, mistralai/*, Qwen/*,
# google/gemma-3-*). Parameter counts (ModelConfig.num_params) match the published ones: 70.55e9,
# 8.03e9, 405.85e9, 1.236e9, 3.213e9, 134.5e6, 361.8e6, 1.711e9, 7.248e9, 0.494e9, 1.544e9, 7.616e9,
# 0.596e9, 8.19e9, 0.268e9, 1.0e9.
NAMED_SHAPES: dict[str, ModelConfig] = {
    "llama-3-8b": _llama3(4096, 14336, 32, 32, 128, ctx=8192, scaling=None, tied=False),
    "llama-3-70b": _llama3(8192, 28672, 80, 64, 128, ctx=8192, scaling=None, tied=False),
    "llama-3.1-8b": _llama3(4096, 14336, 32, 32, 128, ctx=131072, scaling=_L31_SCALING, tied=False),
    "llama-3.1-70b": _llama3(8192, 28672, 80, 64, 128, ctx=131072, scaling=_L31_SCALING, tied=False),
    "llama-3.1-405b": _llama3(16384, 53248, 126, 128, 128, ctx=131072, scaling=_L31_SCALING, tied=False),
    "llama-3.2-1b": _llama3(2048, 8192, 16, 32, 64, ctx=131072, scaling=_L32_SCALING, tied=True),
    "llama-3.2-3b": _llama3(3072, 8192, 28, 24, 128, ctx=131072, scaling=_L32_SCALING, tied=True),
    "smollm2-135m": _smollm2(576, 1536, 30, 9, 3, rope=100000.0),
    "smollm2-360m": _smollm2(960, 2560, 32, 15, 5, rope=100000.0),
    "smollm2-1.7b": _smollm2(2048, 8192, 24, 32, 32, rope=130000.0),
    "mistral-7b": ModelConfig(
        vocab_size=32768,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        bos_token_id=1,
        family=FAMILIES["mistral"],
    ),
    "qwen2.5-0.5b": _qwen(896, 4864, 24, 14, 2, qwen3=False, tied=True),
    "qwen2.5-1.5b": _qwen(1536, 8960, 28, 12, 2, qwen3=False, tied=True),
    "qwen2.5-7b": _qwen(3584, 18944, 28, 28, 4, qwen3=False, tied=False),
    "qwen3-0.6b": _qwen(1024, 3072, 28, 16, 8, qwen3=True, tied=True),
    "qwen3-8b": _qwen(4096, 12288, 36, 32, 8, qwen3=True, tied=False),
    "gemma-3-270m": _gemma3(640, 2048, 18, 4, 1),
    "gemma-3-1b": _gemma3(1152, 6912, 26, 4, 1),
}


def resolve_shape(spec: str) -> ModelConfig:
    """A named shape, an HF config.json / folder, or a .gguf file -> its ModelConfig."""
    named = NAMED_SHAPES.get(spec.strip().lower())
    if named is not None:
        return named
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"{spec}: folder has no config.json")
    if not path.is_file():
        known = ", ".join(NAMED_SHAPES)
        raise ModelLoadError(
            f"unknown model shape {spec!r}: give an HF config.json, a folder holding one, a .gguf file, "
            f"or one of: {known}"
        )
    if path.suffix == ".gguf":
        return _gguf_shape(path)
    try:
        raw = json.loads(path.read_text())
        if not isinstance(raw, dict):
            raise ValueError("not a JSON object")
        return ModelConfig.from_hf(raw)
    except (ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{path}: not a usable HF config.json ({type(e).__name__}: {e})") from e


def _gguf_shape(path: Path) -> ModelConfig:
    """The shape from GGUF metadata only (the loader's mapping; no tensor is read)."""
    from draftgate.models.gguf_file import GGUFFile
    from draftgate.models.gguf_model import gguf_config

    f = GGUFFile(path)
    try:
        config = gguf_config(f.fields, path)
    except (KeyError, ValueError, TypeError) as e:
        raise ModelLoadError(f"{path}: GGUF metadata lacks the model shape ({type(e).__name__}: {e})") from e
    names = {t.name for t in f.tensors}
    return replace(config, tie_word_embeddings="output.weight" not in names)
