"""A Hugging Face folder from a GGUF model, for engines that load only such folders (vLLM).

    python -m draftgate.integrations.vllm.tools.hf_folder [--model smollm2-135m] [--out DIR]

Runs in an environment with ``transformers`` and ``gguf`` (vLLM's, after ``pip install
'draftgate[vllm]'``): transformers' GGUF loader dequantizes the weights (float32) and writes
``config.json``, ``model.safetensors`` and the tokenizer files; the tokenizer's ids are the
GGUF's own, so vLLM and DraftGate tokenize alike. The folder is cached: a second call with
the same model and ``--out`` prints its path at once. Prints the folder's path.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

from draftgate.models.loader import resolve_model_path
from draftgate.paths import default_cache_dir

__all__ = ["export_hf_folder", "main"]

_DONE = ".draftgate-export-done"


def export_hf_folder(model: str, out: Path | None = None) -> Path:
    """The folder for ``model`` (a known name or a .gguf path), made once."""
    gguf = resolve_model_path(model)
    if gguf.suffix != ".gguf":
        raise ValueError(f"{gguf} is not a .gguf file: an HF folder needs no export")
    if out is None:
        key = hashlib.sha256(f"{gguf.resolve()}:{gguf.stat().st_size}".encode()).hexdigest()[:12]
        out = default_cache_dir() / "hf" / f"{gguf.stem}-{key}"
    if (out / _DONE).is_file():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    from safetensors.torch import save_file

    lm = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # transformers marks a GGUF-loaded model as quantized and will not save it; its weights are
    # plain float32 by now, so write them and a config without that mark.
    config = lm.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    tied = bool(getattr(config, "tie_word_embeddings", False))
    state = {k: v.contiguous() for k, v in lm.state_dict().items() if not (tied and k == "lm_head.weight")}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    tok.save_pretrained(out)
    (out / _DONE).write_text(str(gguf) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="a known model name or a .gguf file (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=None, help="the folder (default: under ~/.cache/draftgate/hf)")
    args = ap.parse_args(argv)
    try:
        print(export_hf_folder(args.model, args.out))
    except Exception as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
