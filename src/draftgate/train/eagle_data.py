"""The draft head's data and its measure: the target's continuations and states for a prompt file,
cached by data and settings (``eagle_states``), and the head's held-out agreement with the target
(``head_agreement``)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from draftgate.models.eagle import EagleHead
from draftgate.models.loader import LoadedModel
from draftgate.train.data import data_bytes, data_names, read_records
from draftgate.train.eagle_config import EagleConfig
from draftgate.train.states import States, generate_states

__all__ = ["eagle_states", "head_agreement"]


def eagle_states(
    cfg: EagleConfig,
    target: LoadedModel,
    path: Path | tuple[Path, ...],
    layers: Sequence[int],
    progress: bool,
    label: str,
    deadline: float | None = None,
    log: Callable[[str], None] = print,
) -> list[States]:
    """Continuations + teacher states of the prompt file(s), cached in OUT keyed by data and settings.

    ``deadline``: stop starting sequences then (``generate_states``). A set cut short is cached as
    such and reused only by a run that has a time budget too; a run without one generates it whole.
    """
    n = cfg.continuations if label == "train" else 1  # held-out agreement: the greedy continuation only
    sampled = [n, cfg.sample_temperature, cfg.seed] if n > 1 else []
    on_gpu = torch.device(cfg.device).type == "cuda"
    settings = json.dumps(
        [
            2,
            cfg.target,
            cfg.max_new_tokens,
            cfg.max_len,
            cfg.top_k,
            list(layers),
            *sampled,
            *(["cuda"] if on_gpu else []),
        ]
    ).encode()  # GPU data: a cache of its own
    key = hashlib.sha256(settings + data_bytes(path)).hexdigest()
    cache = cfg.out / f"states-{label}.pt"
    if cache.is_file():
        got = torch.load(cache, weights_only=False)
        if got.get("key") == key and (got.get("complete", True) or deadline is not None):
            return got["states"]
    tally: dict[str, int] = {}
    states = generate_states(
        target,
        read_records(path),
        layers,
        cfg.top_k,
        cfg.max_new_tokens,
        cfg.max_len,
        continuations=n,
        temperature=cfg.sample_temperature,
        seed=cfg.seed,
        progress=progress,
        device=cfg.device,
        batch=256 if on_gpu else 32,  # a GPU step costs about the same for 32 rows or 256
        deadline=deadline,
        tally=tally,
    )
    complete = tally["generated"] == tally["requested"]
    if not complete:
        log(
            f"data budget reached ({cfg.data_share:.0%} of --max-minutes {cfg.max_minutes}): {tally['generated']} of "
            f"{tally['requested']} {label} sequences generated, a random sample of the data; "
            "the rest of the time trains"
        )
    if len(states) < 1:
        raise ValueError(f"{data_names(path)}: no usable examples (prompts too long for --max-len {cfg.max_len}?)")
    cfg.out.mkdir(parents=True, exist_ok=True)
    torch.save({"key": key, "states": states, "complete": complete}, cache)
    return states


@torch.no_grad()
def head_agreement(head: EagleHead, states: Sequence[States], steps: int = 1) -> list[float]:
    """Per rollout step: share of generated positions where the head's greedy token is the target's."""
    hit, total = [0] * steps, [0] * steps
    was = head.training
    head.eval()
    dev = head.vocab_ids.device
    for s in states:
        n, tokens = s.feats.shape[0], s.tokens.cpu()
        nxt = torch.cat([tokens[1:], torch.zeros(steps, dtype=torch.int64)])[None]  # [1, n + steps]
        outs = head.rollout(s.feats.to(dev).float()[None], nxt.to(dev), steps)
        for j, lg in enumerate(outs):
            pred = head.vocab_ids[lg[0].argmax(-1)].cpu()  # [n] the token predicted for row t + j + 1
            t = torch.arange(n)
            want = t + j + 2  # step j + 1 at anchor t predicts the token at t + j + 2
            ok = (want <= n) & (want >= s.start)
            hit[j] += int((pred[ok] == tokens[want[ok]]).sum())
            total[j] += int(ok.sum())
    head.train(was)
    return [h / max(1, t) for h, t in zip(hit, total, strict=True)]
