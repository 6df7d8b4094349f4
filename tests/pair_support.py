"""Draft folders that differ from the tiny model in one respect (for the pairing checks).

Each variant copies the tiny HF folder and edits one file: the tokenizer, its config,
config.json, generation_config.json or the weights.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

JsonEdit = Callable[[dict[str, Any]], None]
_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def _edit_json(path: Path, edit: JsonEdit | None) -> None:
    if edit is not None:
        d = json.loads(path.read_text())
        edit(d)
        path.write_text(json.dumps(d))


def make_variant(
    base: Path,
    dest: Path,
    *,
    tokenizer: JsonEdit | None = None,
    tokenizer_config: JsonEdit | None = None,
    config: JsonEdit | None = None,
    generation_config: JsonEdit | None = None,
    weights: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
) -> Path:
    dest.mkdir(parents=True)
    for name in _FILES:
        if (base / name).is_file():
            shutil.copy(base / name, dest / name)
    _edit_json(dest / "tokenizer.json", tokenizer)
    _edit_json(dest / "tokenizer_config.json", tokenizer_config)
    _edit_json(dest / "config.json", config)
    if (dest / "generation_config.json").is_file():
        _edit_json(dest / "generation_config.json", generation_config)
    if weights is not None:
        w = weights(load_file(str(dest / "model.safetensors")))
        save_file({k: v.contiguous() for k, v in w.items()}, str(dest / "model.safetensors"))
    return dest


def swap_hello_world(tok: dict[str, Any]) -> None:
    """'hello' (id 7) and 'world' (id 8) trade ids: same size, different meaning."""
    v = tok["model"]["vocab"]
    v["hello"], v["world"] = v["world"], v["hello"]


def swapped_vocab_draft(base: Path, dest: Path) -> Path:
    return make_variant(base, dest, tokenizer=swap_hello_world)
