"""What an eagle head's training time buys: the precision its products run in (``choose_precision``),
the measured price of a step (``step_seconds``), and how many steps a time budget fits (``fit_steps``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from draftgate.models.eagle import EagleHead
from draftgate.train.eagle_config import EagleConfig
from draftgate.train.eagle_objective import objective
from draftgate.train.states import States

__all__ = ["choose_precision", "step_seconds", "fit_steps"]


def choose_precision(asked: str, device: torch.device | None = None) -> str:
    """``fp32`` or ``bf16`` for the training products; ``auto`` measures this CPU (bf16 on CUDA).

    bf16 (autocast: bf16 products, float32 weights, optimizer and loss) where a product of a training
    step's shape runs at least 1.3x faster in bf16 than in float32, else fp32. Measured
    (docs/BENCHMARKS.md): an AMD Zen 4 with AVX512-BF16 runs the products
    2.75x faster in bf16 and a training step 1.85-2.2x; the CPU varies between machines, so it is
    measured, never assumed.
    """
    if asked != "auto":
        return asked
    if device is not None and device.type == "cuda":
        return "bf16"  # tensor cores: bf16 products are the GPU's fast path
    gen = torch.Generator().manual_seed(0)  # not the run's seeded stream
    a = torch.randn(1024, 576, generator=gen)  # [rows, C]: one step's activations
    w = torch.randn(1536, 576, generator=gen)  # [F, C]: an MLP weight

    def best(x: torch.Tensor, y: torch.Tensor) -> float:
        x @ y.T  # first call: packing, page faults
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            x @ y.T
            ts.append(time.perf_counter() - t)
        return min(ts)

    fp32 = best(a, w)
    bf16 = best(a.bfloat16(), w.bfloat16())
    return "bf16" if bf16 * 1.3 <= fp32 else "fp32"


def step_seconds(
    head: EagleHead,
    train_s: Sequence[States],
    cfg: EagleConfig,
    sub_of: torch.Tensor,
    precision: str,
    device: torch.device,
) -> tuple[float, float]:
    """Seconds of a training step on the first draft step alone and on the whole rollout: the mean of two
    forwards and backwards of each on probe batches, after one of each to warm up (a first call runs
    ~20% slower). No update; the run's random streams untouched."""
    gen = torch.Generator().manual_seed(cfg.seed + 2)  # not the run's batch stream
    rng = torch.random.get_rng_state()  # the feature noise draws from it
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    took: dict[int, list[float]] = {1: [], cfg.rollout: []}
    for i, S in enumerate((cfg.rollout, 1) + (1, cfg.rollout) * 2):
        t = time.perf_counter()
        objective(head, train_s, cfg, S, sub_of, precision, device, gen).backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:
            took[S].append(time.perf_counter() - t)
    head.zero_grad(set_to_none=True)
    torch.random.set_rng_state(rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state(cuda_rng, device)
    return sum(took[1]) / len(took[1]), sum(took[cfg.rollout]) / len(took[cfg.rollout])


def fit_steps(cfg: EagleConfig, left: float, t_one: float, t_roll: float, t_eval: float, margin: float = 0.96) -> int:
    """The most steps, at most ``cfg.steps``, whose schedule fits ``margin`` of ``left`` seconds.

    A step costs ``t_one`` seconds in the first ``rollout_warmup`` share of the schedule and ``t_roll``
    after it; every ``checkpoint_every`` steps a held-out agreement (``t_eval``) runs, and at the end one
    per rollout step. Fitting the schedule, not only stopping at the deadline, lets a run cut by time
    still decay its learning rate and reach the rollout phase. The margin covers the update, the
    checkpoints and the noise of one timing.
    """
    w = cfg.rollout_warmup if cfg.rollout > 1 else 1.0
    per_step = w * t_one + (1 - w) * t_roll + t_eval / cfg.checkpoint_every
    room = margin * left - cfg.rollout * t_eval
    return max(0, min(cfg.steps, int(room / max(per_step, 1e-9))))
