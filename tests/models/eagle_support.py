"""A small EAGLE head on the tiny model, for the head's tests (model, format, native)."""

from __future__ import annotations

import torch

from draftgate.models.eagle import EagleHead, default_feature_layers
from draftgate.models.loader import LoadedModel


def tiny_head(tiny_model: LoadedModel, seed: int = 0) -> EagleHead:
    """A head over every other vocabulary id, initialised from the target's weights (seeded)."""
    torch.manual_seed(seed)
    cfg = tiny_model.config
    head = EagleHead(cfg, default_feature_layers(cfg.num_layers), torch.arange(0, cfg.vocab_size, 2))
    head.attach_target(tiny_model.weights)
    head.init_weights(tiny_model.weights)
    return head.eval()
