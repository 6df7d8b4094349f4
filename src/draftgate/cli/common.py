"""Argument groups and config building shared by the subcommands (the CLI boundary)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from draftgate.engine.config import DrafterKind, EngineConfig
from draftgate.models.native import LEVELS
from draftgate.models.runner import Kernels
from draftgate.paths import default_cache_dir
from draftgate.types import SamplingParams

__all__ = ["port_arg", "add_engine_args", "add_sampling_args", "engine_config", "sampling_params", "default_cache_dir"]


def port_arg(v: str) -> int:
    try:
        p = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--port must be an integer, got {v!r}") from None
    if not 0 <= p <= 65535:
        raise argparse.ArgumentTypeError(f"--port must be in [0, 65535], got {p}")
    return p


def _k_arg(v: str) -> int | None:
    if v == "auto":
        return None
    try:
        k = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--k must be an integer or 'auto', got {v!r}") from None
    if k < 0:
        raise argparse.ArgumentTypeError("--k must be >= 0")
    return k


def add_engine_args(p: argparse.ArgumentParser, default_drafter: str = "auto") -> None:
    g = p.add_argument_group("model and speculation")
    g.add_argument(
        "--model",
        default="smollm2-135m",
        help="smollm2-135m (bundled), gemma3-270m (installed on first use), a .gguf file or an HF folder",
    )
    g.add_argument(
        "--drafter",
        default=default_drafter,
        choices=[d.value for d in DrafterKind],
        help="draft source: none (plain decoding), ngram, suffix, model, quant (a float target's own quantized "
        "copy), eagle (a draft head on the target's hidden states), auto (default: %(default)s)",
    )
    g.add_argument("--k", type=_k_arg, default=None, metavar="N|auto", help="draft tokens per round (default: auto)")
    g.add_argument("--k-max", type=int, default=8, help="upper bound for adaptive K (default: %(default)s)")
    g.add_argument("--draft-model", default=None, help="draft model for --drafter model (same tokenizer)")
    g.add_argument(
        "--draft-head",
        default=None,
        metavar="DIR",
        help="draft head folder (`draftgate distill --kind eagle`) for --drafter eagle and auto (auto drafts from it "
        "where lookup proposes fewer than 3 tokens); default: the head shipped for the model, if any; "
        "'none': auto without one",
    )
    g.add_argument(
        "--draft-branch",
        type=float,
        default=EngineConfig.draft_branch,
        metavar="P",
        help="a draft head also sends its second choice beside each draft token, as a draft tree, where the "
        "path to it is at least P likely; the target verifies the tree in one forward and keeps the path it "
        "follows (0: never; default: %(default)s)",
    )
    g.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    g.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weights: auto runs a GGUF model's own quantization (Q4_0/Q4_1/Q8_0/Q4_K/Q6_K) on the native "
        "kernels, float32 for HF folders; float32/bfloat16/float16 dequantize (default: %(default)s)",
    )
    g.add_argument("--threads", type=int, default=None, help="CPU threads for the forward (default: all cores)")
    g.add_argument(
        "--kernels",
        default="auto",
        choices=[k.value for k in Kernels],
        help="forward implementation: auto (native CPU kernels on CPU, PyTorch on CUDA), native, or torch "
        "(PyTorch's CPU kernels: slower, batch invariance not guaranteed) (default: %(default)s)",
    )
    g.add_argument(
        "--kernel-level",
        default="auto",
        choices=["auto", *LEVELS],
        help="instruction set of the native kernels: auto (the best this CPU runs) or a lower one, to see what a "
        "CPU without the higher one's instructions gets (default: %(default)s)",
    )
    g.add_argument("--kv-blocks", type=int, default=1024, help="KV cache blocks of 16 tokens (default: %(default)s)")
    g.add_argument(
        "--memory-limit",
        type=float,
        default=None,
        metavar="GiB",
        help="refuse to load models whose weights, KV cache and process need more (default: the memory available)",
    )
    g.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where parsed GGUF weights are cached (default: ~/.cache/draftgate)",
    )


def add_sampling_args(p: argparse.ArgumentParser, max_new_tokens: int = 256) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-new-tokens", type=int, default=max_new_tokens)
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, help="0 = off")
    g.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def engine_config(a: argparse.Namespace) -> EngineConfig:
    if a.threads is not None:
        torch.set_num_threads(max(1, a.threads))
    return EngineConfig(
        model=a.model,
        drafter=DrafterKind(a.drafter),
        k=a.k,
        k_max=max(a.k_max, a.k or 0),
        draft_model=a.draft_model,
        draft_head=getattr(a, "draft_head", None),
        draft_branch=getattr(a, "draft_branch", EngineConfig.draft_branch),
        device=a.device,
        dtype=a.dtype,
        num_blocks=a.kv_blocks,
        cache_dir=a.cache_dir or default_cache_dir(),
        kernels=Kernels(a.kernels),
        kernel_level=None if getattr(a, "kernel_level", "auto") == "auto" else a.kernel_level,
        memory_limit_gib=getattr(a, "memory_limit", None),
    ).validate()


def sampling_params(a: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=a.temperature,
        top_k=a.top_k,
        top_p=a.top_p,
        seed=a.seed,
        max_new_tokens=a.max_new_tokens,
        stop=tuple(a.stop),
    ).validate()
