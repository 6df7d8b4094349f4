"""Model shapes without weights: public Llama-family shapes by name, or read from a config file.

Used by memory planning, where only the shape matters: ``resolve_shape`` takes a
named shape (``llama-3-70b``), an HF ``config.json`` (or the folder holding it),
or a ``.gguf`` file (metadata only; no tensor is read).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftgate.errors import ModelLoadError
from draftgate.models.config import ModelConfig, RopeScaling

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


# The public config.json of each model (meta-llama/*, HuggingFaceTB/SmolLM2-*).
# Parameter counts (ModelConfig.num_params) match the published ones: 70.55e9, 8.03e9,
# 405.85e9, 1.236e9, 3.213e9, 134.5e6, 361.8e6, 1.711e9.
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
    """The shape from GGUF metadata only (the loader's mapping; token strings are never decoded)."""
    from dataclasses import replace

    from gguf import GGUFReader

    from draftgate.models.loader import gguf_config

    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # the reader raises bare ValueError/struct errors on junk
        raise ModelLoadError(f"{path}: not a valid GGUF file ({type(e).__name__}: {e})") from e
    fields: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if key == "tokenizer.ggml.tokens":
            fields[key] = range(len(f.data))  # gguf_config needs only its length
        elif key.startswith(("general.", "llama.")) or key.endswith("_token_id"):
            try:
                fields[key] = f.contents()
            except Exception:  # exotic field types we do not need
                continue
    if "tokenizer.ggml.tokens" not in fields:
        fields["tokenizer.ggml.tokens"] = range(0)
    try:
        config = gguf_config(fields, path)
    except (KeyError, ValueError, TypeError) as e:
        raise ModelLoadError(f"{path}: GGUF metadata lacks the model shape ({type(e).__name__}: {e})") from e
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    return replace(config, tie_word_embeddings=tied)
