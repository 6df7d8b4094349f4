"""What one training step of an eagle head computes: a batch of windows over the target's recorded
states (``make_batch``) and its loss over the head's rollout (``rollout_loss``, EAGLE-3's
training-time test), drawn and computed together by ``objective``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from draftgate.models.eagle import EagleHead
from draftgate.train.distill import kl_ce_mix
from draftgate.train.eagle_config import EagleConfig
from draftgate.train.states import States

__all__ = ["make_batch", "rollout_loss", "objective"]


def make_batch(
    items: Sequence[States], S: int, window: int, sub_of: torch.Tensor, prompt_w: float, gen: torch.Generator
) -> dict[str, torch.Tensor]:
    """A window of rows per sequence, right-padded: feats [B, T, nF, C], nxt [B, T+S-1], targets per row
    (the token, the top-k logits, and ``top``: the target's last feature, its final normed hidden).

    Built where the states live (``sub_of`` with them): CPU states make a CPU batch.
    """
    spans = []
    for s in items:
        n = s.feats.shape[0]
        lo = int(torch.randint(0, max(1, n - window) + 1, (1,), generator=gen)) if n > window else 0
        spans.append((lo, min(n, lo + window)))
    T = max(b - a for a, b in spans)
    B, nF, C = len(items), items[0].feats.shape[1], items[0].feats.shape[2]
    k, dev = items[0].top_v.shape[1], items[0].feats.device
    feats = torch.zeros(B, T, nF, C, device=dev)
    nxt = torch.zeros(B, T + S, dtype=torch.int64, device=dev)  # the token after each row (x_{t+1}), then beyond
    tgt = torch.full((B, T + S), -1, dtype=torch.int64, device=dev)  # row r's token (x_{r+1}) as a subset index
    w = torch.zeros(B, T + S, device=dev)
    tv = torch.full((B, T + S, k), float("-inf"), device=dev)
    ti = torch.zeros(B, T + S, k, dtype=torch.int64, device=dev)
    top = torch.zeros(B, T + S, C, device=dev)  # row r's final normed hidden (the state step j at r - j predicts)
    anchors = torch.zeros(B, T, dtype=torch.bool, device=dev)  # rows that start a rollout (the window's own)
    for b, (s, (lo, hi)) in enumerate(zip(items, spans, strict=True)):
        n, m = s.feats.shape[0], hi - lo  # rows past the window's m anchors serve as later steps' targets
        feats[b, :m] = s.feats[lo:hi].float()
        anchors[b, :m] = True
        end = min(n, lo + T + S)  # rows available for later rollout steps' targets
        r = end - lo
        nxt[b, :r] = s.tokens[lo + 1 : end + 1]
        tgt[b, :r] = sub_of[s.tokens[lo + 1 : end + 1]]
        w[b, :r] = torch.where(torch.arange(lo, end, device=dev) >= s.start - 1, 1.0, prompt_w)
        sub = sub_of[s.top_i[lo:end].long()]  # [r, k]
        tv[b, :r] = s.top_v[lo:end].float().masked_fill(sub < 0, float("-inf"))
        ti[b, :r] = sub.clamp(min=0)
        top[b, :r] = s.feats[lo:end, -1].float()
    return {"feats": feats, "nxt": nxt, "tgt": tgt, "w": w, "tv": tv, "ti": ti, "top": top, "anchors": anchors}


def rollout_loss(
    head: EagleHead, bt: dict[str, torch.Tensor], S: int, alpha: float, decay: float, feature_loss: float = 0.0
) -> torch.Tensor:
    """Weighted mean over anchors and steps of KL + CE, plus ``feature_loss`` x smooth L1 of the predicted
    final normed hidden against the target's (EAGLE-1's regression: C numbers a row, not k logits)."""
    T = bt["feats"].shape[1]
    states: list[torch.Tensor] | None = [] if feature_loss > 0 else None
    outs = head.rollout(bt["feats"], bt["nxt"], S, states)  # S x [B, T, Vs]
    total, norm = bt["feats"].new_zeros(()), 0.0
    for j, logits in enumerate(outs, start=1):
        rows = slice(j, j + T)  # step j at anchor t predicts row t + j's token
        tv, ti, tgt = bt["tv"][:, rows], bt["ti"][:, rows], bt["tgt"][:, rows]  # [B, T, k], [B, T]
        w = bt["w"][:, rows] * bt["anchors"]  # [B, T]
        wj = w * (tgt >= 0) * decay ** (j - 1)
        total = (
            total + (kl_ce_mix(logits.float(), tv, ti, tgt, alpha) * wj).sum()
        )  # [B, T] weighted (float32 under autocast)
        if states is not None:
            reg = F.smooth_l1_loss(states[j - 1].float(), bt["top"][:, rows], reduction="none").mean(-1)  # [B, T]
            total = total + feature_loss * (reg * wj).sum()
        norm += float(wj.sum())
    return total / max(norm, 1e-6)


def objective(
    head: EagleHead,
    train_s: Sequence[States],
    cfg: EagleConfig,
    S: int,
    sub_of: torch.Tensor,
    precision: str,
    device: torch.device,
    gen: torch.Generator,
) -> torch.Tensor:
    """One training batch drawn from ``gen`` and its loss over S rollout steps (bf16 products under autocast)."""
    pick = torch.randint(0, len(train_s), (cfg.batch,), generator=gen).tolist()
    bt = make_batch([train_s[i] for i in pick], S, cfg.window, sub_of, cfg.prompt_weight, gen)
    bt = {k: v.to(device, non_blocking=True) for k, v in bt.items()}
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"), warnings.catch_warnings():
        # bf16 activations into float32 RMS-norm weights take torch's unfused norm: same math, nothing to report
        warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
        return rollout_loss(head, bt, S, cfg.alpha, cfg.step_decay, cfg.feature_loss)
