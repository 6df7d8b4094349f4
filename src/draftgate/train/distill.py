"""`draftgate distill`: train a small draft on the target's own outputs.

Loss per position (DistillSpec / seed 003): ``alpha * T^2 * KL(p_T || q_T) + (1 - alpha) * CE``
where p is the target's distribution (its stored top-k logits, restricted to the
draft's vocabulary subset and renormalized), q the draft's, both softened by the
temperature T, and CE the cross-entropy on the token that actually follows.
Positions the target generated weigh 1, prompt positions ``prompt_weight``.

Seeded (data order and init), checkpointed every ``checkpoint_every`` steps
(model, optimizer, step, data-order generator), resumable, bounded by
``max_minutes``. The output folder is HF-style (config.json, model.safetensors,
tokenizer files) and loads as ``--drafter model --draft-model DIR``.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from draftgate.models.loader import LoadedModel, load_model, save_hf_folder
from draftgate.train.data import (
    Example,
    build_corpus,
    choose_vocab_subset,
    data_bytes,
    data_names,
    read_records,
    teacher_topk,
)
from draftgate.train.student import DraftLM, draft_config, pick_layers

__all__ = [
    "DistillConfig",
    "DistillReport",
    "distill",
    "agreement",
    "warmup_cosine",
    "jsonable",
    "kl_and_ce",
    "kl_ce_mix",
]


@dataclass(frozen=True)
class DistillConfig:
    target: str
    data: Path | tuple[Path, ...]  # one JSONL file or several
    out: Path
    layers: int = 4
    hidden: int | None = None  # None: the target's width (start from its weights)
    vocab_subset: int = 8192  # 0: full vocabulary
    steps: int = 300
    batch: int = 16
    lr: float = 3e-4
    temperature: float = 1.0
    alpha: float = 0.5  # weight of the KL term; 1 - alpha on cross-entropy
    prompt_weight: float = 0.25
    max_new_tokens: int = 128
    max_len: int = 512
    top_k: int = 32
    seed: int = 0
    checkpoint_every: int = 50
    max_minutes: float | None = None
    resume: bool = False
    eval_fraction: float = 0.05

    def validate(self) -> DistillConfig:
        if self.layers < 1:
            raise ValueError(f"--layers must be >= 1, got {self.layers}")
        if self.hidden is not None and self.hidden < 64:
            raise ValueError(f"--hidden must be >= 64, got {self.hidden}")
        if self.vocab_subset < 0 or 0 < self.vocab_subset < 16:
            raise ValueError(f"--vocab-subset must be 0 (full vocabulary) or >= 16, got {self.vocab_subset}")
        if self.steps < 0 or self.batch < 1 or not self.lr > 0 or not self.temperature > 0:
            raise ValueError("--steps must be >= 0, --batch >= 1, --lr and --temperature > 0")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"--alpha must be in [0, 1], got {self.alpha}")
        if self.max_new_tokens < 1 or self.max_len < 8 or self.top_k < 1 or self.checkpoint_every < 1:
            raise ValueError("--max-new-tokens, --top-k and --checkpoint-every must be >= 1, --max-len >= 8")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError("--max-minutes must be > 0")
        return self


@dataclass
class DistillReport:
    out: str
    layers: list[int]
    examples: int
    eval_examples: int
    train_tokens: int
    vocab_subset: int
    subset_coverage: float
    steps: int
    agreement_before: float
    agreement_after: float
    seconds_data: float
    seconds_train: float
    seconds_total: float
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out agreement)
    losses: list[float] = field(default_factory=list)


def _corpus(cfg: DistillConfig, target: LoadedModel, progress: bool) -> dict:
    """Continuations + teacher top-k, cached in OUT/corpus.pt keyed by the data and settings."""
    settings = json.dumps([cfg.target, cfg.max_new_tokens, cfg.max_len, cfg.top_k]).encode()
    key = hashlib.sha256(settings + data_bytes(cfg.data)).hexdigest()
    path = cfg.out / "corpus.pt"
    if path.is_file():
        cached = torch.load(path, weights_only=False)
        if cached.get("key") == key:
            return cached
    records = read_records(cfg.data)
    examples = build_corpus(target, records, cfg.max_new_tokens, cfg.max_len, batch=32, progress=progress)
    if len(examples) < 2:
        raise ValueError(f"--data {data_names(cfg.data)}: need at least 2 usable examples, got {len(examples)}")
    teacher = teacher_topk(target, examples, cfg.top_k, progress=progress)
    corpus = {"key": key, "examples": examples, "teacher": teacher}
    cfg.out.mkdir(parents=True, exist_ok=True)
    torch.save(corpus, path)
    return corpus


def _batch(
    examples: Sequence[Example],
    teacher: Sequence[tuple[torch.Tensor, torch.Tensor]],
    sub_of: torch.Tensor,
    prompt_w: float,
) -> dict[str, torch.Tensor]:
    """Right-padded inputs [B, T], next-token targets in subset indices [B, T] (-1: none), weights [B, T]."""
    T = max(len(e.tokens) for e in examples) - 1
    B, k = len(examples), teacher[0][0].shape[1]
    inp = torch.zeros(B, T, dtype=torch.int64)
    tgt = torch.full((B, T), -1, dtype=torch.int64)
    w = torch.zeros(B, T)
    tv = torch.full((B, T, k), float("-inf"))  # teacher logits on its top-k
    ti = torch.full((B, T, k), -1, dtype=torch.int64)  # their subset indices (-1: outside the subset)
    for b, (e, (vals, idx)) in enumerate(zip(examples, teacher, strict=True)):
        n = len(e.tokens) - 1
        toks = torch.tensor(e.tokens, dtype=torch.int64)  # [n+1]
        inp[b, :n] = toks[:-1]
        tgt[b, :n] = sub_of[toks[1:]]
        w[b, :n] = prompt_w
        w[b, max(0, e.start - 1) : n] = 1.0
        ti[b, :n] = sub_of[idx.long()]
        tv[b, :n] = vals.float()
    tv = tv.masked_fill(ti < 0, float("-inf"))
    return {"inp": inp, "tgt": tgt, "w": w, "tv": tv, "ti": ti.clamp(min=0)}


def kl_and_ce(
    logits: torch.Tensor, tv: torch.Tensor, ti: torch.Tensor, tgt: torch.Tensor, T: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position [B, L]: KL(p || q) on the target's top-k and cross-entropy on its token.

    logits [B, L, Vs] the student's over the subset; tv [B, L, k] the target's top-k logits (-inf
    where outside the subset), ti [B, L, k] their subset indices; tgt [B, L] the target's token as a
    subset index (-1: none). p and q are softened by T (KL scaled by T^2); 0 where either is undefined.
    """
    log_q = torch.log_softmax(logits, dim=-1)  # [B, L, Vs]
    log_qt = log_q if T == 1.0 else torch.log_softmax(logits / T, dim=-1)  # softened for the KL
    has_p = torch.isfinite(tv).any(-1)  # [B, L]: some teacher mass inside the subset
    p = torch.softmax(tv / T, dim=-1).nan_to_num(0.0)  # [B, L, k]
    kl = (p * (p.clamp_min(1e-12).log() - log_qt.gather(-1, ti))).sum(-1) * T * T  # [B, L]
    kl = torch.where(has_p, kl, torch.zeros_like(kl))
    ce = -log_q.gather(-1, tgt.clamp(min=0)[..., None])[..., 0]  # [B, L]
    ce = torch.where(tgt >= 0, ce, torch.zeros_like(ce))
    return kl, ce


class _SparseSoftCE(torch.autograd.Function):
    """Per row: ``sum(r) * logsumexp(logits) - sum_j r_j * logits[idx_j]`` (the cross-entropy of q
    = softmax(logits) against the sparse weights r); backward writes one dense gradient, with no
    log-softmax tensor, no gather-backward zeros and no log-softmax backward (a third of an eagle
    training step on the CPU went to those)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, idx: torch.Tensor, r: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        lse = torch.logsumexp(logits, dim=-1)  # logits [N, V] -> [N]
        ctx.save_for_backward(logits, lse, idx, r)  # idx, r [N, m]
        return r.sum(-1) * lse - (r * logits.gather(-1, idx)).sum(-1)  # [N]

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        logits, lse, idx, r = ctx.saved_tensors
        grad = torch.sub(logits, lse[:, None]).exp_()  # q [N, V]
        grad.mul_((g * r.sum(-1))[:, None])
        grad.scatter_add_(-1, idx, -(g[:, None] * r))
        return grad, None, None


def kl_ce_mix(
    logits: torch.Tensor, tv: torch.Tensor, ti: torch.Tensor, tgt: torch.Tensor, alpha: float
) -> torch.Tensor:
    """``alpha * KL + (1 - alpha) * CE`` per position [B, L], the values (and gradients) of
    ``kl_and_ce`` at T = 1 with a fused backward. Same arguments as ``kl_and_ce``."""
    k = ti.shape[-1]
    has_p = torch.isfinite(tv).any(-1, keepdim=True)  # [B, L, 1]
    p = torch.softmax(tv, dim=-1).nan_to_num(0.0) * has_p  # [B, L, k]
    idx = torch.cat([ti, tgt.clamp(min=0)[..., None]], dim=-1)  # [B, L, k + 1]
    r = torch.cat([alpha * p, (1 - alpha) * (tgt >= 0)[..., None].to(p.dtype)], dim=-1)  # [B, L, k + 1]
    neg_entropy = alpha * (p * p.clamp_min(1e-12).log()).sum(-1)  # [B, L]: the KL's part without q
    rows = _SparseSoftCE.apply(logits.reshape(-1, logits.shape[-1]), idx.reshape(-1, k + 1), r.reshape(-1, k + 1))
    return rows.view(tgt.shape) + neg_entropy


def optimizer_step(
    loss: torch.Tensor,
    params: Iterable[torch.nn.Parameter],
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LRScheduler,
) -> float:
    """One update (gradients clipped to norm 1); returns the loss as a float."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sched.step()
    return float(loss.detach())


def _loss(model: DraftLM, bt: dict[str, torch.Tensor], T: float, alpha: float) -> torch.Tensor:
    kl, ce = kl_and_ce(model(bt["inp"]), bt["tv"], bt["ti"], bt["tgt"], T)  # [B, T] each
    w = bt["w"]  # [B, T]
    return ((alpha * kl + (1 - alpha) * ce) * w).sum() / w.sum().clamp_min(1e-6)


@torch.no_grad()
def agreement(model: DraftLM, examples: Sequence[Example], batch: int = 8) -> float:
    """Share of target-generated positions where the draft's greedy token equals the target's."""
    hit = total = 0
    model.eval()
    for s in range(0, len(examples), batch):
        part = examples[s : s + batch]
        T = max(len(e.tokens) for e in part) - 1
        inp = torch.zeros(len(part), T, dtype=torch.int64)  # [B, T]
        for b, e in enumerate(part):
            inp[b, : len(e.tokens) - 1] = torch.tensor(e.tokens[:-1])
        pred = model(inp).argmax(-1)  # [B, T] subset indices
        if model.out_ids is not None:
            pred = model.out_ids[pred]
        for b, e in enumerate(part):
            n = len(e.tokens) - 1
            want = torch.tensor(e.tokens[e.start :])  # [n - start + 1]
            got = pred[b, e.start - 1 : n]
            hit += int((got == want).sum())
            total += want.numel()
    model.train()
    return hit / max(1, total)


def distill(cfg: DistillConfig, progress: bool = True, log: Callable[[str], None] = print) -> DistillReport:
    cfg.validate()
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    target = load_model(cfg.target)
    corpus = _corpus(cfg, target, progress)
    examples: list[Example] = corpus["examples"]
    teacher = corpus["teacher"]
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
    n_eval = max(1, int(round(len(examples) * cfg.eval_fraction)))
    ev, tr = order[:n_eval], order[n_eval:] or order[:1]
    eval_ex = [examples[i] for i in ev]
    train_ex, train_t = [examples[i] for i in tr], [teacher[i] for i in tr]
    t_data = time.perf_counter() - t0

    V = target.config.vocab_size
    if cfg.vocab_subset and cfg.vocab_subset < V:
        out_ids, coverage = choose_vocab_subset(train_ex, train_t, cfg.vocab_subset, target.config.eos_token_ids)
    else:
        out_ids, coverage = None, 1.0
    sub_of = torch.full((V,), -1, dtype=torch.int64)  # token id -> subset index
    sub_of[out_ids if out_ids is not None else torch.arange(V)] = torch.arange(
        out_ids.numel() if out_ids is not None else V
    )
    dcfg = draft_config(target.config, cfg.layers, cfg.hidden)
    layers = pick_layers(target.config.num_layers, cfg.layers)
    model = DraftLM.from_target(target, dcfg, out_ids, layers)
    model.embed.weight.requires_grad_(dcfg.hidden_size != target.config.hidden_size)  # keep the target's
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
    sched = warmup_cosine(opt, cfg.steps)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    step, losses = 0, []
    evals: list[tuple[int, float]] = []  # (step, held-out agreement)
    ckpt = cfg.out / "checkpoint.pt"
    if cfg.resume and ckpt.is_file():
        st = torch.load(ckpt, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        gen.set_state(st["gen"])
        step, losses, evals = st["step"], st["losses"], st.get("evals", [])
        log(f"resumed from {ckpt} at step {step}")
    before = agreement(DraftLM.from_target(target, dcfg, out_ids, layers), eval_ex)
    log(
        f"{len(train_ex)} train / {len(eval_ex)} eval sequences; layers {layers}; "
        f"vocab subset {out_ids.numel() if out_ids is not None else V} (covers {coverage:.1%}); "
        f"agreement before {before:.1%}"
    )

    def save() -> None:
        torch.save(
            {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "sched": sched.state_dict(),
                "gen": gen.get_state(),
                "step": step,
                "losses": losses,
                "evals": evals,
            },
            ckpt,
        )
        _save_folder(cfg.out, target, model)

    t_train0 = time.perf_counter()
    bar = tqdm(total=cfg.steps, initial=step, desc="distill", unit="step", disable=not progress)
    model.train()
    while step < cfg.steps:
        if cfg.max_minutes is not None and time.perf_counter() - t0 > cfg.max_minutes * 60:
            log(f"stopping at step {step}: --max-minutes {cfg.max_minutes} reached")
            break
        pick = torch.randint(0, len(train_ex), (cfg.batch,), generator=gen).tolist()
        bt = _batch([train_ex[i] for i in pick], [train_t[i] for i in pick], sub_of, cfg.prompt_weight)
        loss = optimizer_step(_loss(model, bt, cfg.temperature, cfg.alpha), model.parameters(), opt, sched)
        step += 1
        losses.append(round(loss, 4))
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}")
        if step % cfg.checkpoint_every == 0:
            save()
            evals.append((step, round(agreement(model, eval_ex), 4)))
            bar.write(f"step {step}: loss {loss:.3f}, held-out agreement {evals[-1][1]:.1%}")
    bar.close()
    t_train = time.perf_counter() - t_train0
    save()
    after = agreement(model, eval_ex)
    report = DistillReport(
        out=str(cfg.out),
        layers=layers,
        examples=len(examples),
        eval_examples=len(eval_ex),
        train_tokens=sum(len(e.tokens) for e in train_ex),
        vocab_subset=int(out_ids.numel()) if out_ids is not None else V,
        subset_coverage=round(coverage, 4),
        steps=step,
        agreement_before=round(before, 4),
        agreement_after=round(after, 4),
        seconds_data=round(t_data, 1),
        seconds_train=round(t_train, 1),
        seconds_total=round(time.perf_counter() - t0, 1),
        evals=evals,
        losses=losses,
    )
    (cfg.out / "distill.json").write_text(
        json.dumps({"config": jsonable(asdict(cfg)), "report": asdict(report)}, indent=2)
    )
    log(f"agreement with the target on held-out continuations: {before:.1%} -> {after:.1%}; wrote {cfg.out}")
    return report


def warmup_cosine(opt: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over min(20, steps / 10) steps, then cosine decay to 10% of the peak at ``steps``."""
    warm = max(1, min(20, steps // 10))
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / max(1, steps)))))
    )


def _save_folder(out: Path, target: LoadedModel, model: DraftLM) -> None:
    save_hf_folder(LoadedModel(model.cfg, model.hf_weights(), target.tokenizer, out), out)
    target.tokenizer.save_hf(out)


def jsonable(d: dict) -> dict:
    """A config's fields for JSON: paths as strings (a tuple of them as a list)."""

    def one(v: object) -> object:
        if isinstance(v, tuple) and all(isinstance(x, Path) for x in v):
            return [str(x) for x in v]
        return str(v) if isinstance(v, Path) else v

    return {k: one(v) for k, v in d.items()}
