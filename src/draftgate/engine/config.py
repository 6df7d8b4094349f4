"""The engine's typed configuration, validated once at the edge (CLI, routes file, tests)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

import torch

from draftgate.models.native import LEVELS
from draftgate.models.runner import Kernels

__all__ = ["DrafterKind", "EngineConfig", "DTYPES"]

# The one table of weight dtypes a config may name. "auto": a GGUF model's own quantized blocks on
# the native kernels (float32 for what they do not read, and on other kernels or HF folders).
DTYPES = {"auto": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DrafterKind(str, enum.Enum):
    NONE = "none"
    NGRAM = "ngram"
    SUFFIX = "suffix"
    MODEL = "model"
    QUANT = "quant"
    EAGLE = "eagle"
    AUTO = "auto"


@dataclass(frozen=True)
class EngineConfig:
    model: str = "smollm2-135m"
    drafter: DrafterKind = DrafterKind.AUTO
    k: int | None = None  # None: adaptive (goodput controller); 0..k_max: fixed
    k_max: int = 8  # most draft tokens per round
    draft_model: str | None = None  # for drafter=model (same tokenizer as the target)
    draft_head: str | None = (
        None  # a head folder; None: the one shipped for the model (eagle, auto); "none": auto without
    )
    # A draft head's runner-up beside each chain token goes along as a leaf of a draft tree where the path to it
    # is at least this likely (verified in the same forward under a tree attention mask); 0: never
    draft_branch: float = 0.15
    device: str = "cpu"
    dtype: str = "auto"  # a GGUF model runs its own quantization; HF folders float32
    num_blocks: int = 1024  # KV blocks (block_size tokens each) shared by all running requests
    block_size: int = 16
    max_batch: int = 16  # concurrently running sequences
    max_queue: int = 256  # waiting requests before submit() refuses
    enable_prefix_cache: bool = True
    cache_dir: Path | None = None  # where parsed GGUF weights are cached (None: not cached)
    ngram_max: int = 4
    kernels: Kernels = Kernels.AUTO  # native CPU kernels (batch invariant by construction) or PyTorch's
    # The native kernels' instruction-set level (models.native.LEVELS); None: the best this CPU runs. A lower
    # level shows what a CPU without the higher one's instructions gets (an AVX2-only EPYC, say).
    kernel_level: str | None = None
    # Refuse to load a target (and draft model) whose weights, KV cache and process exceed this many GiB
    # (modelinfo.host_memory); None: the memory available when loading starts.
    memory_limit_gib: float | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def quantized(self) -> bool:
        """Run a GGUF model's own quantized weights (``dtype: auto``)."""
        return self.dtype == "auto"

    def validate(self) -> EngineConfig:
        if not isinstance(self.drafter, DrafterKind):
            raise ValueError(f"unknown drafter {self.drafter!r}; choose from {[d.value for d in DrafterKind]}")
        if not 0 <= self.k_max <= 32:
            raise ValueError(f"k_max must be in [0, 32], got {self.k_max}")
        if self.k is not None and not 0 <= self.k <= self.k_max:
            raise ValueError(f"k must be in [0, k_max={self.k_max}] or auto, got {self.k}")
        if self.drafter == DrafterKind.MODEL and not self.draft_model:
            raise ValueError("drafter 'model' needs --draft-model PATH (a Llama-family model with the same tokenizer)")
        if not 0.0 <= self.draft_branch <= 1.0:
            raise ValueError(f"draft_branch must be in [0, 1] (0: no draft tree), got {self.draft_branch}")
        if not isinstance(self.kernels, Kernels):
            raise ValueError(f"unknown kernels {self.kernels!r}; choose from {[k.value for k in Kernels]}")
        if self.kernel_level is not None and self.kernel_level not in LEVELS:
            raise ValueError(f"kernel level must be one of {', '.join(LEVELS)}, got {self.kernel_level!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.num_blocks < 1 or self.block_size < 1 or self.max_batch < 1 or self.max_queue < 1:
            raise ValueError("num_blocks, block_size, max_batch and max_queue must be positive")
        if self.memory_limit_gib is not None and not self.memory_limit_gib > 0:
            raise ValueError(f"memory limit must be a positive number of GiB, got {self.memory_limit_gib}")
        return self
