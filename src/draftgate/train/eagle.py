"""`draftgate distill --kind eagle`: train an EAGLE-style draft head on the target's own states.

Data: the target's continuations of the prompts (the greedy one, and ``continuations - 1`` sampled
ones), recorded while generating: at every position the target's top-k logits and its features at
the head's layers, from the forward that computes them anyway (``train.states``).

Loss per position and rollout step j (``EagleHead.rollout``, EAGLE-3's training-time test; the
first ``rollout_warmup`` share of the steps trains the first draft step alone, which on this CPU
learns several times faster per second, then the whole rollout):
``alpha * KL(p || q) + (1 - alpha) * CE`` on the token after the step's, p the target's top-k
restricted to the head's vocabulary subset, weighted 1 on generated positions and
``prompt_weight`` on the prompt, and ``step_decay ** (j - 1)`` per step. Seeded, checkpointed
(resume continues bit-for-bit the same run), bounded by ``max_minutes`` (the schedule laid over the
steps that fit, ``fit_steps``), with the held-out
agreement (the head's greedy token = the target's, one step from the target's features) at each
checkpoint. The output folder (head.json, head.safetensors) loads as ``--drafter eagle --draft-head DIR``.
``device`` cuda generates the data on the GPU (PyTorch's forward) and trains there; the head starts
from the same initial weights on any device.

Here: the data, the run and its checkpoints. The settings are ``eagle_config``'s, what a step
computes ``eagle_objective``'s, and the time budget's measurements and arithmetic ``eagle_budget``'s.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from draftgate.models.config import ModelConfig
from draftgate.models.eagle import EagleHead, default_feature_layers
from draftgate.models.eagle_format import target_fingerprint
from draftgate.models.loader import LoadedModel, load_model
from draftgate.train.data import Example, choose_vocab_subset, data_names
from draftgate.train.distill import jsonable, optimizer_step, warmup_cosine
from draftgate.train.eagle_budget import choose_precision, fit_steps, step_seconds
from draftgate.train.eagle_config import EagleConfig
from draftgate.train.eagle_data import eagle_states, head_agreement
from draftgate.train.eagle_objective import objective
from draftgate.train.states import States

__all__ = ["EagleReport", "train_eagle", "train_head", "head_agreement"]


@dataclass
class EagleReport:
    out: str
    feature_layers: list[int]
    examples: int
    eval_examples: int
    train_tokens: int
    vocab_subset: int
    subset_coverage: float
    steps: int
    agreement_before: float
    agreement_after: float
    agreement_per_step: list[float]  # after training, rollout steps 1..rollout
    seconds_data: float
    seconds_train: float
    seconds_total: float
    precision: str  # fp32 or bf16: what the training steps ran in
    evals: list[tuple[int, float]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


@dataclass
class _Run:
    """A training run's state between steps: what a checkpoint holds and a resume restores."""

    head: EagleHead
    opt: torch.optim.Optimizer
    gen: torch.Generator  # the batches' stream
    device: torch.device
    precision: str  # fp32 or bf16: what the training steps run in
    ckpt: Path
    sched: torch.optim.lr_scheduler.LRScheduler | None = None  # laid over ``planned`` (train_head)
    planned: int = 0  # the steps the learning rate and the rollout phase are laid out over
    fitted: bool = False  # ``planned`` fitted to --max-minutes (kept by a resume)
    step: int = 0
    losses: list[float] = field(default_factory=list)
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, held-out agreement)

    def save(self, out: Path, meta: dict) -> None:
        """The checkpoint, and the head folder in ``out`` with ``meta``."""
        assert self.sched is not None
        out.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "head": self.head.state_dict(),
                "opt": self.opt.state_dict(),
                "sched": self.sched.state_dict(),
                "gen": self.gen.get_state(),
                "rng": torch.random.get_rng_state(),
                "step": self.step,
                "losses": self.losses,
                "evals": self.evals,
                "precision": self.precision,
                "planned": self.planned,
                "fitted": self.fitted,
                "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            },
            self.ckpt,
        )
        self.head.save(out, meta)

    def restore(self, st: dict) -> None:
        """Continue the checkpointed run ``st``: weights, optimizer, schedule, random streams and history."""
        assert self.sched is not None
        self.head.load_state_dict(st["head"])
        self.opt.load_state_dict(st["opt"])
        self.sched.load_state_dict(st["sched"])
        self.gen.set_state(st["gen"])
        torch.random.set_rng_state(st["rng"])  # the feature noise
        if self.device.type == "cuda" and st.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(st["cuda_rng"], self.device)
        self.step, self.losses, self.evals = st["step"], st["losses"], st["evals"]


def train_eagle(cfg: EagleConfig, progress: bool = True, log: Callable[[str], None] = print) -> EagleReport:
    cfg.validate()
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    target = load_model(cfg.target)
    tcfg = target.config
    layers = default_feature_layers(tcfg.num_layers)
    deadline = None if cfg.max_minutes is None else t0 + cfg.data_share * cfg.max_minutes * 60
    states = eagle_states(cfg, target, cfg.data, layers, progress, "train", deadline, log)
    if cfg.eval_data is not None:
        train_s, eval_s = states, eagle_states(cfg, target, cfg.eval_data, layers, progress, "eval", log=log)
    else:
        order = torch.randperm(len(states), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
        n_eval = max(1, int(round(len(states) * cfg.eval_fraction)))
        eval_s = [states[i] for i in order[:n_eval]]
        train_s = [states[i] for i in order[n_eval:]] or eval_s
    examples = len(states) if cfg.eval_data is None else len(train_s)
    return train_head(cfg, target, train_s, eval_s, t0, examples=examples, progress=progress, log=log)


def train_head(
    cfg: EagleConfig,
    target: LoadedModel,
    train_s: Sequence[States],
    eval_s: Sequence[States],
    t0: float,
    examples: int | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> EagleReport:
    """Train, checkpoint and save a head on given states (``train_eagle`` after its data; t0: when the run began).

    The states may live on ``cfg.device`` already (a batch is built where they are); on the CPU
    each batch is copied over.
    """
    t_data = time.perf_counter() - t0
    vocab_ids, coverage, sub_of = _vocab_subset(cfg, target.config, train_s)
    run, st = _new_run(cfg, target, vocab_ids)
    before = _plan(cfg, run, st, train_s, eval_s, sub_of, t0, log)
    run.sched = warmup_cosine(run.opt, run.planned)
    if st is not None:
        run.restore(st)
        log(f"resumed from {run.ckpt} at step {run.step}")
    if before is None:
        before = run.evals[0][1] if run.evals else head_agreement(run.head, eval_s)[0]  # evals[0]: step 0
    if not run.evals:
        run.evals.append((0, round(before, 4)))
    layers = list(run.head.feature_layers)
    log(
        f"{len(train_s)} train / {len(eval_s)} eval sequences; feature layers {layers}; vocab subset "
        f"{vocab_ids.numel()} (covers {coverage:.1%}); agreement before {before:.1%}; {run.precision} products"
    )
    meta = _meta(cfg, target, run)
    t1 = time.perf_counter()
    _train(cfg, run, meta, train_s, eval_s, sub_of, t0, progress, log)
    t_train = time.perf_counter() - t1
    per_step = _finish(cfg, run, meta, eval_s, t0)
    report = EagleReport(
        out=str(cfg.out),
        feature_layers=layers,
        examples=len(train_s) if examples is None else examples,
        eval_examples=len(eval_s),
        train_tokens=sum(int(s.tokens.numel()) for s in train_s),
        vocab_subset=int(vocab_ids.numel()),
        subset_coverage=round(coverage, 4),
        steps=run.step,
        agreement_before=round(before, 4),
        agreement_after=round(per_step[0], 4),
        agreement_per_step=[round(a, 4) for a in per_step],
        seconds_data=round(t_data, 1),
        seconds_train=round(t_train, 1),
        seconds_total=round(time.perf_counter() - t0, 1),
        precision=run.precision,
        evals=run.evals,
        losses=run.losses,
    )
    (cfg.out / "distill.json").write_text(
        json.dumps({"config": jsonable(asdict(cfg)), "report": asdict(report)}, indent=2)
    )
    log(
        f"head agreement with the target on held-out continuations: {before:.1%} -> {per_step[0]:.1%} "
        f"(rollout steps {', '.join(f'{a:.1%}' for a in per_step)}); wrote {cfg.out}"
    )
    return report


def _vocab_subset(
    cfg: EagleConfig, tcfg: ModelConfig, train_s: Sequence[States]
) -> tuple[torch.Tensor, float, torch.Tensor]:
    """The head's vocabulary subset (``choose_vocab_subset`` over the training states), its coverage, and
    ``sub_of`` [V]: each target id's row in the subset, -1 outside it, beside the states."""
    ex = [Example(tuple(s.tokens.tolist()), s.start) for s in train_s]
    top = [(s.top_v, s.top_i) for s in train_s]
    vocab_ids, coverage = choose_vocab_subset(ex, top, min(cfg.vocab_subset, tcfg.vocab_size), tcfg.eos_token_ids)
    sub_of = torch.full((tcfg.vocab_size,), -1, dtype=torch.int64)
    sub_of[vocab_ids] = torch.arange(vocab_ids.numel())
    return vocab_ids, coverage, sub_of.to(train_s[0].feats.device)  # the batches are built where the states are


def _new_run(cfg: EagleConfig, target: LoadedModel, vocab_ids: torch.Tensor) -> tuple[_Run, dict | None]:
    """A new head, its optimizer and batch stream, and the checkpoint a resume continues (None without one)."""
    torch.manual_seed(cfg.seed)  # here, not only at the start: generating the data draws from it
    device = torch.device(cfg.device)
    head = EagleHead(target.config, default_feature_layers(target.config.num_layers), vocab_ids)
    head.init_weights(target.weights)  # on the CPU: the same initial head on any device
    head = head.to(device).attach_target(target.weights)
    head.feature_noise = cfg.feature_noise
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    ckpt = cfg.out / "checkpoint.pt"
    st = torch.load(ckpt, weights_only=False, map_location="cpu") if cfg.resume and ckpt.is_file() else None
    # A resumed run keeps its precision (its steps continue bit for bit), whatever this CPU prefers.
    precision = st.get("precision", "fp32") if st is not None else choose_precision(cfg.precision, device)
    if st is not None and cfg.precision not in ("auto", precision):
        raise ValueError(
            f"{ckpt} was trained with --precision {precision}; resume with it (or auto), not {cfg.precision}"
        )
    return _Run(head, opt, gen, device, precision, ckpt), st


def _plan(
    cfg: EagleConfig,
    run: _Run,
    st: dict | None,
    train_s: Sequence[States],
    eval_s: Sequence[States],
    sub_of: torch.Tensor,
    t0: float,
    log: Callable[[str], None],
) -> float | None:
    """Set the steps the learning rate and the rollout phase are laid out over: --steps, or under
    --max-minutes as many as the time left fits (measured once, kept by a resume; --steps is the
    resume's own otherwise). Returns the held-out agreement before training if the plan measured it."""
    run.planned, run.fitted = cfg.steps, False
    if st is not None:
        run.fitted = st.get("fitted", False)
        run.planned = st["planned"] if run.fitted else cfg.steps
    elif cfg.max_minutes is not None and time.perf_counter() - t0 >= cfg.max_minutes * 60:
        run.planned = 0  # the data took the whole budget
    elif cfg.max_minutes is not None and cfg.steps > 0:
        t = time.perf_counter()
        before = head_agreement(run.head, eval_s)[0]
        t_eval = time.perf_counter() - t
        t_one, t_roll = step_seconds(run.head, train_s, cfg, sub_of, run.precision, run.device)
        left = t0 + cfg.max_minutes * 60 - time.perf_counter()
        run.planned = fit_steps(cfg, left, t_one, t_roll, t_eval)
        run.fitted = run.planned < cfg.steps
        if run.fitted:
            log(
                f"--max-minutes {cfg.max_minutes}: {left:.0f} s left for training fits {run.planned} of "
                f"--steps {cfg.steps} "
                f"({t_one:.2f} s a first-step step, {t_roll:.2f} s a rollout step); the learning rate and the "
                f"rollout phase are laid out over {run.planned}"
            )
        return before
    return None


def _meta(cfg: EagleConfig, target: LoadedModel, run: _Run) -> dict:
    """What head.json records besides the head's shape: the target it is for and how it was trained."""
    return {
        "target": target_fingerprint(target.config, target.weights),
        "target_source": cfg.target,
        "trained": {
            "data": data_names(cfg.data),
            "seed": cfg.seed,
            "steps": cfg.steps,
            "schedule_steps": run.planned,
            "batch": cfg.batch,
            "rollout": cfg.rollout,
            "rollout_warmup": cfg.rollout_warmup,
            "lr": cfg.lr,
            "feature_noise": cfg.feature_noise,
            "feature_loss": cfg.feature_loss,
            "data_share": cfg.data_share,
            "weight_decay": cfg.weight_decay,
            "vocab_subset": cfg.vocab_subset,
            "continuations": cfg.continuations,
            "sample_temperature": cfg.sample_temperature,
            "precision": run.precision,
            "device": run.device.type,
        },
    }


def _train(
    cfg: EagleConfig,
    run: _Run,
    meta: dict,
    train_s: Sequence[States],
    eval_s: Sequence[States],
    sub_of: torch.Tensor,
    t0: float,
    progress: bool,
    log: Callable[[str], None],
) -> None:
    """Steps until the plan's end (or --max-minutes'), every ``checkpoint_every`` a held-out agreement and a save."""
    assert run.sched is not None
    bar = tqdm(total=run.planned, initial=run.step, desc="eagle head", unit="step", disable=not progress)
    run.head.train()
    while run.step < run.planned:
        if cfg.max_minutes is not None and time.perf_counter() - t0 > cfg.max_minutes * 60:
            log(f"stopping at step {run.step}: --max-minutes {cfg.max_minutes} reached")
            break
        S = (
            1 if run.step < cfg.rollout_warmup * run.planned else cfg.rollout
        )  # one step learns fastest; then the rollout
        batch_loss = objective(run.head, train_s, cfg, S, sub_of, run.precision, run.device, run.gen)
        loss = optimizer_step(batch_loss, run.head.parameters(), run.opt, run.sched)
        run.step += 1
        run.losses.append(round(loss, 4))
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}")
        if run.step % cfg.checkpoint_every == 0:
            run.evals.append((run.step, round(head_agreement(run.head, eval_s)[0], 4)))
            run.save(cfg.out, meta)
            bar.write(f"step {run.step}: loss {loss:.3f}, held-out agreement {run.evals[-1][1]:.1%}")
    bar.close()


def _finish(cfg: EagleConfig, run: _Run, meta: dict, eval_s: Sequence[States], t0: float) -> list[float]:
    """The held-out agreement per rollout step after training, recorded in the history and in head.json;
    the last save."""
    per_step = head_agreement(run.head, eval_s, cfg.rollout)
    if not run.evals or run.evals[-1][0] != run.step:
        run.evals.append((run.step, round(per_step[0], 4)))
    meta["trained"]["seconds"] = round(time.perf_counter() - t0, 1)
    meta["trained"]["agreement"] = round(per_step[0], 4)
    run.save(cfg.out, meta)
    return per_step
