"""Find and load a model: a name, a GGUF file, or an HF safetensors folder, of one of the families
in ``config.FAMILIES`` (any other architecture is refused with its name and the supported list).

Weights come out under the runner's names (HF Llama's, plus the norms other families add:
``Family.layer_weights``), every RMSNorm weight as the forward multiplies by (an HF Gemma checkpoint's
``w`` becomes ``1 + w``, as llama.cpp's converter writes it). A tensor the forward would not read
is an error, never silently dropped. GGUF files: ``gguf_model`` (their matrices kept in the file's own
format with ``quantized=True``, ``--dtype auto``; else dequantized once and cached).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from draftgate.errors import ModelLoadError
from draftgate.models.config import ModelConfig
from draftgate.models.gguf_blocks import Blocks
from draftgate.models.gguf_file import GGUFFile
from draftgate.models.gguf_model import gguf_info, load_gguf
from draftgate.models.known import KNOWN_MODELS, known_model_path
from draftgate.models.llama import VOCAB_SUBSET_KEY
from draftgate.models.tokenizer import TextTokenizer
from draftgate.models.weights import ModelWeights

__all__ = ["LoadedModel", "resolve_model_path", "load_model", "save_hf_folder", "KNOWN_MODELS"]


@dataclass(frozen=True)
class LoadedModel:
    config: ModelConfig
    # Runner names (model.layers.{i}.self_attn.q_proj.weight, ...), [out, in]; a dict given here is
    # wrapped. A GGUF file loaded with ``quantized=True`` keeps its matrices as blocks only.
    weights: ModelWeights
    tokenizer: TextTokenizer
    source: Path
    # The original GGUF file; None for HF folders.
    gguf_path: Path | None = None
    # Weights the native kernels run from GGUF blocks (runner names): a file's own (``--dtype auto``),
    # or a float model's quantized copy (the ``quant`` self-draft).
    blocks: Mapping[str, Blocks] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.weights, ModelWeights):
            object.__setattr__(self, "weights", ModelWeights(self.weights))

    @property
    def dtype(self) -> torch.dtype:
        """The float dtype the model computes in."""
        return self.weights.dtype


def resolve_model_path(name_or_path: str) -> Path:
    """A known name (``smollm2-135m``, ``gemma3-270m``: models/known.py) or a path to a ``.gguf`` file / HF folder."""
    if name_or_path in KNOWN_MODELS:
        return known_model_path(name_or_path)
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
    """Float weights in ``dtype``; ``quantized``: a GGUF file's matrices in their own format only, run from
    its blocks (``LoadedModel.blocks``) with no float copy."""
    path = resolve_model_path(name_or_path)
    try:
        if path.is_dir():
            loaded = _load_hf_folder(path)
        elif path.suffix == ".gguf":
            config, weights, tok = load_gguf(path, cache_dir, quantized)
            _check_weights(config, weights, path)
            loaded = LoadedModel(config, weights, tok, path, path, weights.block_only or None)
        else:
            raise ModelLoadError(f"{path}: not a .gguf file or a folder with config.json")
    except ModelLoadError:
        raise
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        raise ModelLoadError(f"cannot load {path}: {type(e).__name__}: {e}") from e
    if dtype != torch.float32:
        loaded = replace(loaded, weights=loaded.weights.to(dtype))
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
        config, tok = gguf_info(GGUFFile(path))
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
    weights = _hf_to_runner(config, weights)
    _check_weights(config, weights, folder)
    return LoadedModel(config, weights, tok, folder)


# An HF Gemma layer's norms -> the runner's (its pre-feedforward norm is where Llama's post-attention one is).
_GEMMA_NORMS = {
    "post_attention_layernorm": "self_attn.o_norm",
    "pre_feedforward_layernorm": "post_attention_layernorm",
    "post_feedforward_layernorm": "mlp.down_norm",
}


def _hf_to_runner(config: ModelConfig, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An HF checkpoint's tensors under the runner's names, RMSNorm weights as the forward multiplies by."""
    fam = config.family
    if not fam.sandwich_norms and not fam.norm_offset:
        return weights
    out: dict[str, torch.Tensor] = {}
    for k, v in weights.items():
        if fam.sandwich_norms and k.startswith("model.layers."):
            _, _, i, rest = k.split(".", 3)
            part = rest.removesuffix(".weight")
            k = f"model.layers.{i}.{_GEMMA_NORMS.get(part, part)}.weight" if rest.endswith(".weight") else k
        if fam.norm_offset and (k.endswith("norm.weight") or k.endswith("layernorm.weight")):
            v = v + fam.norm_offset  # Gemma's RMSNorm multiplies by (1 + w)
        out[k] = v
    return out


def save_hf_folder(model: LoadedModel, folder: Path) -> None:
    """Write config.json + model.safetensors (tokenizer files are the caller's business)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.config.to_hf(), indent=2))
    save_file({k: v.contiguous() for k, v in model.weights.items()}, str(folder / "model.safetensors"))


def _check_weights(config: ModelConfig, weights: Mapping[str, torch.Tensor], src: Path) -> None:
    """Every tensor the family's forward reads is there, and there is none it would not read."""
    need = ["model.embed_tokens.weight", "model.norm.weight"]
    for i in range(config.num_layers):
        need += [f"model.layers.{i}.{n}" for n in config.family.layer_weights]
    missing = [n for n in need if n not in weights]
    if missing:
        raise ModelLoadError(f"{src}: missing weights {missing[:3]}{'...' if len(missing) > 3 else ''}")
    unread = sorted(set(weights) - set(need) - {"lm_head.weight", VOCAB_SUBSET_KEY})
    if unread:
        raise ModelLoadError(
            f"{src}: {len(unread)} tensors a {config.family.name} model does not have (e.g. {unread[0]}): "
            f"DraftGate would not read them, so this is not a model it runs as it was trained"
        )
    w = weights if isinstance(weights, ModelWeights) else ModelWeights(weights)
    emb = w.shape("model.embed_tokens.weight")
    if emb != (config.vocab_size, config.hidden_size):
        raise ModelLoadError(f"{src}: embedding shape {emb} does not match the config")
    subset = w.dense.get(VOCAB_SUBSET_KEY)  # [Vs] int64
    if subset is not None:
        head = w.shape("lm_head.weight") if "lm_head.weight" in w else None
        if config.tie_word_embeddings or head is None or subset.dtype != torch.int64 or subset.ndim != 1:
            raise ModelLoadError(f"{src}: {VOCAB_SUBSET_KEY} needs an untied lm_head.weight and int64 ids")
        if head != (subset.numel(), config.hidden_size):
            raise ModelLoadError(f"{src}: lm_head shape {head} does not match {subset.numel()} subset ids")
        if subset.numel() and not (0 <= int(subset.min()) and int(subset.max()) < config.vocab_size):
            raise ModelLoadError(f"{src}: {VOCAB_SUBSET_KEY} ids must be in [0, {config.vocab_size})")
