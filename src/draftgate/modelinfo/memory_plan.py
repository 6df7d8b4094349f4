"""GPU memory envelope for a target + draft pair (pure arithmetic on model shapes).

The envelope (seed 001)::

    budget = target weights + draft weights + KV cache (target AND draft) + system reserve

- Weights: ``num_params * bytes per parameter`` of the chosen dtype. int8/int4 are
  nominal (1 and 0.5 bytes); their quantization scales and any layers kept in 16 bit
  add a few percent, which the reserve absorbs.
- KV cache per token, per model: ``2 (K and V) * layers * kv_heads * head_dim * bytes``.
  The draft keeps its own KV for every sequence, over the same tokens as the target
  (its K lookahead tokens are too few to count).
- System reserve: activations, CUDA context and allocator slack. Default: 10% of
  the budget, the same share vLLM leaves with its default ``gpu_memory_utilization=0.9``.

Seed 003 caps the draft (weights + its KV) at 10% of GPU memory; above that the plan
carries a warning, since every byte the draft takes is KV cache the target loses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from draftgate.models.config import ModelConfig

__all__ = [
    "GIB",
    "WeightDtype",
    "KvDtype",
    "DEFAULT_RESERVE_FRACTION",
    "DRAFT_SHARE_LIMIT",
    "ModelMemory",
    "MemoryPlan",
    "model_memory",
    "plan_memory",
]

GIB = 1 << 30
WeightDtype = Literal["fp32", "bf16", "fp16", "int8", "int4"]
KvDtype = Literal["fp32", "bf16", "fp16", "fp8"]
WEIGHT_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0, "int4": 0.5}
KV_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
DEFAULT_RESERVE_FRACTION = 0.10
DRAFT_SHARE_LIMIT = 0.10


def default_kv_dtype(dtype: WeightDtype) -> KvDtype:
    """The KV cache follows float weights; weight-only int8/int4 keep a 16-bit KV cache."""
    return "bf16" if dtype in ("int8", "int4") else dtype  # type: ignore[return-value]


@dataclass(frozen=True)
class ModelMemory:
    """One model's footprint: weights (bytes) and KV cache per token (bytes)."""

    params: int
    weight_bytes: int
    kv_bytes_per_token: int


def model_memory(cfg: ModelConfig, dtype: WeightDtype, kv_dtype: KvDtype) -> ModelMemory:
    kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * KV_BYTES[kv_dtype]
    return ModelMemory(cfg.num_params, math.ceil(cfg.num_params * WEIGHT_BYTES[dtype]), kv)


@dataclass(frozen=True)
class MemoryPlan:
    """The envelope for one GPU budget; every size in bytes."""

    budget_bytes: int
    reserve_bytes: int
    target: ModelMemory
    draft: ModelMemory | None
    context: int  # tokens per sequence (prompt + output)
    max_seqs: int | None  # the requested concurrency, if any
    dtype: WeightDtype
    kv_dtype: KvDtype
    warnings: tuple[str, ...] = ()

    @property
    def weight_bytes(self) -> int:
        return self.target.weight_bytes + (self.draft.weight_bytes if self.draft else 0)

    @property
    def free_for_kv_bytes(self) -> int:
        """Budget left for KV cache after weights and reserve (negative: the weights do not fit)."""
        return self.budget_bytes - self.reserve_bytes - self.weight_bytes

    @property
    def kv_bytes_per_seq(self) -> int:
        per_token = self.target.kv_bytes_per_token + (self.draft.kv_bytes_per_token if self.draft else 0)
        return self.context * per_token

    @property
    def weights_fit(self) -> bool:
        return self.free_for_kv_bytes > 0

    @property
    def seqs_fit(self) -> int:
        """How many concurrent sequences of ``context`` tokens fit (target + draft KV each)."""
        return max(0, self.free_for_kv_bytes) // self.kv_bytes_per_seq

    @property
    def max_seqs_fit(self) -> bool | None:
        return None if self.max_seqs is None else self.max_seqs <= self.seqs_fit

    @property
    def planned_seqs(self) -> int:
        """Sequences the breakdown is drawn for: ``max_seqs`` if given, else as many as fit."""
        return self.max_seqs if self.max_seqs is not None else self.seqs_fit

    def kv_bytes(self, which: Literal["target", "draft"]) -> int:
        m = self.target if which == "target" else self.draft
        return 0 if m is None else self.planned_seqs * self.context * m.kv_bytes_per_token

    @property
    def draft_bytes(self) -> int:
        """Draft weights + the draft's KV at ``planned_seqs``."""
        return 0 if self.draft is None else self.draft.weight_bytes + self.kv_bytes("draft")

    @property
    def draft_share(self) -> float:
        return self.draft_bytes / self.budget_bytes

    def weights_problem(self) -> str | None:
        """A one-line reason when the weights and reserve alone exceed the budget."""
        if self.weights_fit:
            return None
        need = self.weight_bytes + self.reserve_bytes
        return (
            f"the weights do not fit: {_gib(self.weight_bytes)} GiB of {self.dtype} weights + "
            f"{_gib(self.reserve_bytes)} GiB reserve = {_gib(need)} GiB, more than the "
            f"{_gib(self.budget_bytes)} GiB budget; use a smaller --dtype (int8, int4), "
            "more GPU memory (or more GPUs), or a smaller --reserve"
        )

    def to_json(self) -> dict[str, Any]:
        def mem(m: ModelMemory | None, which: Literal["target", "draft"]) -> dict[str, Any] | None:
            if m is None:
                return None
            return {
                "params": m.params,
                "weights_gib": _gib(m.weight_bytes),
                "kv_bytes_per_token": m.kv_bytes_per_token,
                "kv_gib": _gib(self.kv_bytes(which)),
            }

        return {
            "budget_gib": _gib(self.budget_bytes),
            "reserve_gib": _gib(self.reserve_bytes),
            "dtype": self.dtype,
            "kv_dtype": self.kv_dtype,
            "context": self.context,
            "target": mem(self.target, "target"),
            "draft": mem(self.draft, "draft"),
            "free_for_kv_gib": _gib(self.free_for_kv_bytes),
            "kv_gib_per_seq": _gib(self.kv_bytes_per_seq),
            "seqs_fit": self.seqs_fit,
            "max_seqs": self.max_seqs,
            "max_seqs_fit": self.max_seqs_fit,
            "planned_seqs": self.planned_seqs,
            "draft_share": round(self.draft_share, 4),
            "weights_fit": self.weights_fit,
            "warnings": list(self.warnings),
        }


def plan_memory(
    target: ModelConfig,
    draft: ModelConfig | None,
    gpu_gib: float,
    *,
    dtype: WeightDtype = "bf16",
    kv_dtype: KvDtype | None = None,
    context: int = 4096,
    max_seqs: int | None = None,
    reserve_gib: float | None = None,
) -> MemoryPlan:
    """The envelope for ``gpu_gib`` GiB of GPU memory. Raises ValueError on bad input."""
    if not gpu_gib > 0 or not math.isfinite(gpu_gib):
        raise ValueError(f"--gpu-memory must be a positive number of GiB, got {gpu_gib}")
    if dtype not in WEIGHT_BYTES:
        raise ValueError(f"--dtype must be one of {', '.join(get_args(WeightDtype))}, got {dtype!r}")
    kv_dtype = kv_dtype or default_kv_dtype(dtype)
    if kv_dtype not in KV_BYTES:
        raise ValueError(f"--kv-dtype must be one of {', '.join(get_args(KvDtype))}, got {kv_dtype!r}")
    if context < 1:
        raise ValueError(f"--context must be >= 1 token, got {context}")
    if max_seqs is not None and max_seqs < 1:
        raise ValueError(f"--max-seqs must be >= 1, got {max_seqs}")
    budget = int(gpu_gib * GIB)
    if reserve_gib is None:
        reserve = int(budget * DEFAULT_RESERVE_FRACTION)
    elif not 0 <= reserve_gib < gpu_gib:
        raise ValueError(f"--reserve must be >= 0 and below --gpu-memory ({gpu_gib} GiB), got {reserve_gib}")
    else:
        reserve = int(reserve_gib * GIB)
    plan = MemoryPlan(
        budget_bytes=budget,
        reserve_bytes=reserve,
        target=model_memory(target, dtype, kv_dtype),
        draft=model_memory(draft, dtype, kv_dtype) if draft is not None else None,
        context=context,
        max_seqs=max_seqs,
        dtype=dtype,
        kv_dtype=kv_dtype,
    )
    return _with_warnings(plan, target, draft)


def _with_warnings(plan: MemoryPlan, target: ModelConfig, draft: ModelConfig | None) -> MemoryPlan:
    warnings: list[str] = []
    if plan.draft is not None and plan.draft_share > DRAFT_SHARE_LIMIT:
        warnings.append(
            f"the draft takes {_gib(plan.draft_bytes)} GiB ({plan.draft_share:.0%} of the budget: weights "
            f"+ its KV for {plan.planned_seqs} sequences), over the {DRAFT_SHARE_LIMIT:.0%} guideline; "
            "that memory is KV cache the target loses: a smaller draft leaves room for more sequences"
        )
    if plan.context > target.max_position_embeddings:
        warnings.append(
            f"--context {plan.context} exceeds the target's max_position_embeddings {target.max_position_embeddings}"
        )
    if draft is not None and plan.context > draft.max_position_embeddings:
        warnings.append(
            f"--context {plan.context} exceeds the draft's max_position_embeddings "
            f"{draft.max_position_embeddings}: its drafts degrade past that (output stays lossless)"
        )
    return replace(plan, warnings=tuple(warnings))


def _gib(n: int | float) -> float:
    return round(n / GIB, 2)
