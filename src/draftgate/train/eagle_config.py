"""The settings of `draftgate distill --kind eagle` (``EagleConfig``) and their checks.

``validate`` refuses a bad value with a ``ValueError`` that names its flag (``--vocab-subset``
for ``vocab_subset``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["EagleConfig", "PRECISIONS"]

PRECISIONS = ("auto", "fp32", "bf16")  # --precision


@dataclass(frozen=True)
class EagleConfig:
    target: str
    data: Path | tuple[Path, ...]  # one JSONL file or several
    out: Path
    eval_data: Path | None = None  # held-out prompts (default: a fraction of --data)
    vocab_subset: int = 4096
    steps: int = 1000
    batch: int = 12
    lr: float = 2e-3
    alpha: float = 0.5
    prompt_weight: float = 0.25
    rollout: int = 2  # training-time test steps
    rollout_warmup: float = 0.85  # share of the steps trained on one step (the head's first draft) first
    feature_noise: float = 0.2  # Gaussian noise on the normalised features while training
    weight_decay: float = 0.05
    step_decay: float = 0.8
    feature_loss: float = 0.0  # weight of EAGLE-1's regression of the predicted state onto the target's (smooth L1)
    max_new_tokens: int = 128
    continuations: int = 1  # per training prompt: the greedy one, then sampled ones
    sample_temperature: float = 0.8  # of the sampled continuations
    max_len: int = 512
    window: int = 256  # rows per training sequence (a random window of a longer one)
    top_k: int = 32
    seed: int = 0
    checkpoint_every: int = 50
    max_minutes: float | None = None
    data_share: float = 0.5  # of --max-minutes, at most, for generating the training data (the rest trains)
    resume: bool = False
    eval_fraction: float = 0.05
    precision: str = "auto"  # of the training products: fp32, bf16 (autocast), auto (bf16 where measured faster)
    device: str = "cpu"  # where the target generates the data and the head trains: cpu or cuda[:N]

    def validate(self) -> EagleConfig:
        if self.vocab_subset < 16:
            raise ValueError(f"--vocab-subset must be >= 16 for an eagle head, got {self.vocab_subset}")
        if self.steps < 0 or self.batch < 1 or not self.lr > 0:
            raise ValueError("--steps must be >= 0, --batch >= 1 and --lr > 0")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"--alpha must be in [0, 1], got {self.alpha}")
        if not 1 <= self.rollout <= 8 or not 0 < self.step_decay <= 1 or not 0 <= self.rollout_warmup <= 1:
            raise ValueError("--rollout must be in 1..8, --step-decay in (0, 1] and --rollout-warmup in [0, 1]")
        if self.max_new_tokens < 1 or self.max_len < 8 or self.window < 8 or self.top_k < 1:
            raise ValueError("--max-new-tokens and --top-k must be >= 1, --max-len and --window >= 8")
        if self.continuations < 1 or not self.sample_temperature > 0:
            raise ValueError("--continuations must be >= 1 and --sample-temperature > 0")
        if self.feature_noise < 0 or self.weight_decay < 0 or self.feature_loss < 0:
            raise ValueError("--feature-noise, --weight-decay and --feature-loss must be >= 0")
        if self.checkpoint_every < 1:
            raise ValueError("--checkpoint-every must be >= 1")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError("--max-minutes must be > 0")
        if not 0 < self.data_share <= 1:
            raise ValueError(f"--data-share must be in (0, 1], got {self.data_share}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        try:
            dev = torch.device(self.device)
        except RuntimeError as e:
            raise ValueError(f"--device must be cpu or cuda[:N], got {self.device!r}") from e
        if dev.type not in ("cpu", "cuda"):
            raise ValueError(f"--device must be cpu or cuda[:N], got {self.device!r}")
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {self.device}: this torch sees no CUDA device; use --device cpu")
        return self
