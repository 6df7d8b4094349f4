"""The EAGLE draft head's folder format and the target it belongs to.

A head folder holds ``head.safetensors`` (the trainable weights in float16 and ``vocab_ids``,
the target ids of its output rows, in int32) and ``head.json`` (``FORMAT``, the feature layers,
the size of the vocabulary subset and what the trainer adds, among it ``target``: the
fingerprint of the model the head was trained for). The embedding and the output rows are the
target's and never saved, so ``check_target`` refuses a head for another model (``check-pair``
semantics).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from draftgate.errors import ModelLoadError
from draftgate.models.config import ModelConfig

__all__ = ["FORMAT", "target_fingerprint", "check_target", "write_head", "read_head"]

FORMAT = "draftgate-eagle-head/1"
_PROBE_IDS = (0, 1, 2, 100, 1000)  # embedding rows whose sums identify the target's weights


def target_fingerprint(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> dict:
    """The target's shape and a few sums of its embedding rows (equal in any dtype to ~1e-3)."""
    emb = weights["model.embed_tokens.weight"]
    rows = [i for i in _PROBE_IDS if i < cfg.vocab_size]
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_layers": cfg.num_layers,
        "probe": [round(float(emb[i].float().abs().sum()), 4) for i in rows],
    }


def check_target(meta: dict, cfg: ModelConfig, weights: dict[str, torch.Tensor], where: str) -> None:
    """Refuse a head trained for another target, with the reason."""
    want, have = meta.get("target") or {}, target_fingerprint(cfg, weights)
    for key in ("vocab_size", "hidden_size", "num_layers"):
        if want.get(key) != have[key]:
            raise ModelLoadError(
                f"draft head {where} was trained for a target with {key} = {want.get(key)}, "
                f"this target has {have[key]}: train one for it with `draftgate distill --kind eagle`"
            )
    probe = want.get("probe") or []
    if len(probe) != len(have["probe"]) or any(
        abs(a - b) > 2e-3 * max(1.0, abs(a)) for a, b in zip(probe, have["probe"], strict=False)
    ):
        raise ModelLoadError(
            f"draft head {where} was trained for a different target (same shape, other weights): "
            "its drafts would rarely be accepted; train one for this model with `draftgate distill --kind eagle`"
        )


def write_head(
    folder: Path, state: dict[str, torch.Tensor], vocab_ids: torch.Tensor, feature_layers: Sequence[int], meta: dict
) -> None:
    """Write a head folder: ``state`` (the head's state dict) in float16, ``vocab_ids`` in int32, and ``meta``."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in state.items() if k != "vocab_ids"}
    tensors["vocab_ids"] = vocab_ids.to("cpu", torch.int32).contiguous()
    save_file(tensors, str(folder / "head.safetensors"))
    info = {"format": FORMAT, "feature_layers": list(feature_layers), "vocab_subset": int(vocab_ids.numel()), **meta}
    (folder / "head.json").write_text(json.dumps(info, indent=2) + "\n")


def read_head(folder: Path, cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> tuple[dict, dict[str, torch.Tensor]]:
    """A head folder's ``head.json`` and tensors, once its format and its target (this one) are checked."""
    meta_path, w_path = folder / "head.json", folder / "head.safetensors"
    if not meta_path.is_file() or not w_path.is_file():
        raise ModelLoadError(f"{folder}: not a draft head folder (needs head.json and head.safetensors)")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FORMAT:
        raise ModelLoadError(f"{folder}: head format {meta.get('format')!r}, expected {FORMAT!r}")
    check_target(meta, cfg, weights, str(folder))
    return meta, load_file(str(w_path))
