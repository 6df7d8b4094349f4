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
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from draftgate.models.eagle import EagleHead, default_feature_layers, target_fingerprint
from draftgate.models.loader import LoadedModel, load_model
from draftgate.train.data import Example, choose_vocab_subset, data_bytes, data_names, read_records
from draftgate.train.distill import jsonable, kl_ce_mix, optimizer_step, warmup_cosine
from draftgate.train.states import States, generate_states

__all__ = ["EagleConfig", "EagleReport", "train_eagle", "train_head", "head_agreement", "choose_precision", "fit_steps"]


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


def _states(cfg: EagleConfig, target: LoadedModel, path: Path | tuple[Path, ...], layers: Sequence[int], progress: bool,
            label: str, deadline: float | None = None, log: Callable[[str], None] = print) -> list[States]:  # fmt: skip
    """Continuations + teacher states of the prompt file(s), cached in OUT keyed by data and settings.

    ``deadline``: stop starting sequences then (``generate_states``). A set cut short is cached as
    such and reused only by a run that has a time budget too; a run without one generates it whole.
    """
    n = cfg.continuations if label == "train" else 1  # held-out agreement: the greedy continuation only
    sampled = [n, cfg.sample_temperature, cfg.seed] if n > 1 else []
    on_gpu = torch.device(cfg.device).type == "cuda"
    settings = json.dumps([2, cfg.target, cfg.max_new_tokens, cfg.max_len, cfg.top_k, list(layers), *sampled,
                           *(["cuda"] if on_gpu else [])]).encode()  # fmt: skip  # GPU data: a cache of its own
    key = hashlib.sha256(settings + data_bytes(path)).hexdigest()
    cache = cfg.out / f"states-{label}.pt"
    if cache.is_file():
        got = torch.load(cache, weights_only=False)
        if got.get("key") == key and (got.get("complete", True) or deadline is not None):
            return got["states"]
    tally: dict[str, int] = {}
    states = generate_states(
        target, read_records(path), layers, cfg.top_k, cfg.max_new_tokens, cfg.max_len, continuations=n,
        temperature=cfg.sample_temperature, seed=cfg.seed, progress=progress, device=cfg.device,
        batch=256 if on_gpu else 32,  # a GPU step costs about the same for 32 rows or 256
        deadline=deadline, tally=tally,
    )  # fmt: skip
    complete = tally["generated"] == tally["requested"]
    if not complete:
        log(f"data budget reached ({cfg.data_share:.0%} of --max-minutes {cfg.max_minutes}): {tally['generated']} of "
            f"{tally['requested']} {label} sequences generated, a random sample of the data; the rest of the time trains")  # fmt: skip
    if len(states) < 1:
        raise ValueError(f"{data_names(path)}: no usable examples (prompts too long for --max-len {cfg.max_len}?)")
    cfg.out.mkdir(parents=True, exist_ok=True)
    torch.save({"key": key, "states": states, "complete": complete}, cache)
    return states


def _batch(items: Sequence[States], S: int, window: int, sub_of: torch.Tensor, prompt_w: float,
           gen: torch.Generator) -> dict[str, torch.Tensor]:  # fmt: skip
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


def _loss(head: EagleHead, bt: dict[str, torch.Tensor], S: int, alpha: float, decay: float,
          feature_loss: float = 0.0) -> torch.Tensor:  # fmt: skip
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
        total = total + (kl_ce_mix(logits.float(), tv, ti, tgt, alpha) * wj).sum()  # [B, T] weighted (float32 under autocast)
        if states is not None:
            reg = F.smooth_l1_loss(states[j - 1].float(), bt["top"][:, rows], reduction="none").mean(-1)  # [B, T]
            total = total + feature_loss * (reg * wj).sum()
        norm += float(wj.sum())
    return total / max(norm, 1e-6)


def _objective(head: EagleHead, train_s: Sequence[States], cfg: EagleConfig, S: int, sub_of: torch.Tensor,
               precision: str, device: torch.device, gen: torch.Generator) -> torch.Tensor:  # fmt: skip
    """One training batch drawn from ``gen`` and its loss over S rollout steps (bf16 products under autocast)."""
    pick = torch.randint(0, len(train_s), (cfg.batch,), generator=gen).tolist()
    bt = _batch([train_s[i] for i in pick], S, cfg.window, sub_of, cfg.prompt_weight, gen)
    bt = {k: v.to(device, non_blocking=True) for k, v in bt.items()}
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"), warnings.catch_warnings():
        # bf16 activations into float32 RMS-norm weights take torch's unfused norm: same math, nothing to report
        warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
        return _loss(head, bt, S, cfg.alpha, cfg.step_decay, cfg.feature_loss)


def _step_seconds(head: EagleHead, train_s: Sequence[States], cfg: EagleConfig, sub_of: torch.Tensor,
                  precision: str, device: torch.device) -> tuple[float, float]:  # fmt: skip
    """Seconds of a training step on the first draft step alone and on the whole rollout: the mean of two
    forwards and backwards of each on probe batches, after one of each to warm up (a first call runs
    ~20% slower). No update; the run's random streams untouched."""
    gen = torch.Generator().manual_seed(cfg.seed + 2)  # not the run's batch stream
    rng = torch.random.get_rng_state()  # the feature noise draws from it
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    took: dict[int, list[float]] = {1: [], cfg.rollout: []}
    for i, S in enumerate((cfg.rollout, 1) + (1, cfg.rollout) * 2):
        t = time.perf_counter()
        _objective(head, train_s, cfg, S, sub_of, precision, device, gen).backward()
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


def train_eagle(cfg: EagleConfig, progress: bool = True, log: Callable[[str], None] = print) -> EagleReport:
    cfg.validate()
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    target = load_model(cfg.target)
    tcfg = target.config
    layers = default_feature_layers(tcfg.num_layers)
    deadline = None if cfg.max_minutes is None else t0 + cfg.data_share * cfg.max_minutes * 60
    states = _states(cfg, target, cfg.data, layers, progress, "train", deadline, log)
    if cfg.eval_data is not None:
        train_s, eval_s = states, _states(cfg, target, cfg.eval_data, layers, progress, "eval", log=log)
    else:
        order = torch.randperm(len(states), generator=torch.Generator().manual_seed(cfg.seed)).tolist()
        n_eval = max(1, int(round(len(states) * cfg.eval_fraction)))
        eval_s = [states[i] for i in order[:n_eval]]
        train_s = [states[i] for i in order[n_eval:]] or eval_s
    examples = len(states) if cfg.eval_data is None else len(train_s)
    return train_head(cfg, target, train_s, eval_s, t0, examples=examples, progress=progress, log=log)


def train_head(
    cfg: EagleConfig, target: LoadedModel, train_s: Sequence[States], eval_s: Sequence[States], t0: float,
    examples: int | None = None, progress: bool = True, log: Callable[[str], None] = print,
) -> EagleReport:  # fmt: skip
    """Train, checkpoint and save a head on given states (``train_eagle`` after its data; t0: when the run began).

    The states may live on ``cfg.device`` already (a batch is built where they are); on the CPU
    each batch is copied over.
    """
    tcfg = target.config
    layers = default_feature_layers(tcfg.num_layers)
    t_data = time.perf_counter() - t0

    ex = [Example(tuple(s.tokens.tolist()), s.start) for s in train_s]
    top = [(s.top_v, s.top_i) for s in train_s]
    vocab_ids, coverage = choose_vocab_subset(ex, top, min(cfg.vocab_subset, tcfg.vocab_size), tcfg.eos_token_ids)
    sub_of = torch.full((tcfg.vocab_size,), -1, dtype=torch.int64)
    sub_of[vocab_ids] = torch.arange(vocab_ids.numel())
    sub_of = sub_of.to(train_s[0].feats.device)  # [V] beside the states: the batches are built there
    torch.manual_seed(cfg.seed)  # here, not only at the start: generating the data draws from it
    device = torch.device(cfg.device)
    head = EagleHead(tcfg, layers, vocab_ids)
    head.init_weights(target.weights)  # on the CPU: the same initial head on any device
    head = head.to(device).attach_target(target.weights)
    head.feature_noise = cfg.feature_noise
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    step, losses, evals = 0, [], []
    ckpt = cfg.out / "checkpoint.pt"
    st = torch.load(ckpt, weights_only=False, map_location="cpu") if cfg.resume and ckpt.is_file() else None
    # A resumed run keeps its precision (its steps continue bit for bit), whatever this CPU prefers.
    precision = st.get("precision", "fp32") if st is not None else choose_precision(cfg.precision, device)
    if st is not None and cfg.precision not in ("auto", precision):
        raise ValueError(f"{ckpt} was trained with --precision {precision}; resume with it (or auto), not {cfg.precision}")
    # The steps the learning rate and the rollout phase are laid out over: --steps, or under --max-minutes
    # as many as the time left fits (measured once, kept by a resume; --steps is the resume's own otherwise).
    planned, fitted, before = cfg.steps, False, None
    if st is not None:
        fitted = st.get("fitted", False)
        planned = st["planned"] if fitted else cfg.steps
    elif cfg.max_minutes is not None and time.perf_counter() - t0 >= cfg.max_minutes * 60:
        planned = 0  # the data took the whole budget
    elif cfg.max_minutes is not None and cfg.steps > 0:
        t = time.perf_counter()
        before = head_agreement(head, eval_s)[0]
        t_eval = time.perf_counter() - t
        t_one, t_roll = _step_seconds(head, train_s, cfg, sub_of, precision, device)
        left = t0 + cfg.max_minutes * 60 - time.perf_counter()
        planned = fit_steps(cfg, left, t_one, t_roll, t_eval)
        fitted = planned < cfg.steps
        if fitted:
            log(f"--max-minutes {cfg.max_minutes}: {left:.0f} s left for training fits {planned} of --steps {cfg.steps} "
                f"({t_one:.2f} s a first-step step, {t_roll:.2f} s a rollout step); the learning rate and the "
                f"rollout phase are laid out over {planned}")  # fmt: skip
    sched = warmup_cosine(opt, planned)
    if st is not None:
        head.load_state_dict(st["head"])
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        gen.set_state(st["gen"])
        torch.random.set_rng_state(st["rng"])  # the feature noise
        if device.type == "cuda" and st.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(st["cuda_rng"], device)
        step, losses, evals = st["step"], st["losses"], st["evals"]
        log(f"resumed from {ckpt} at step {step}")
    if before is None:
        before = evals[0][1] if evals else head_agreement(head, eval_s)[0]  # evals[0]: step 0
    if not evals:
        evals.append((0, round(before, 4)))
    log(f"{len(train_s)} train / {len(eval_s)} eval sequences; feature layers {list(layers)}; vocab subset "
        f"{vocab_ids.numel()} (covers {coverage:.1%}); agreement before {before:.1%}; {precision} products")  # fmt: skip
    meta = {
        "target": target_fingerprint(tcfg, target.weights),
        "target_source": cfg.target,
        "trained": {"data": data_names(cfg.data), "seed": cfg.seed, "steps": cfg.steps, "schedule_steps": planned,
                    "batch": cfg.batch,
                    "rollout": cfg.rollout, "rollout_warmup": cfg.rollout_warmup, "lr": cfg.lr,
                    "feature_noise": cfg.feature_noise, "feature_loss": cfg.feature_loss, "data_share": cfg.data_share, "weight_decay": cfg.weight_decay,
                    "vocab_subset": cfg.vocab_subset, "continuations": cfg.continuations,
                    "sample_temperature": cfg.sample_temperature, "precision": precision, "device": device.type},
    }  # fmt: skip

    def save() -> None:
        cfg.out.mkdir(parents=True, exist_ok=True)
        torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                    "gen": gen.get_state(), "rng": torch.random.get_rng_state(), "step": step, "losses": losses,
                    "evals": evals, "precision": precision, "planned": planned, "fitted": fitted,
                    "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}, ckpt)  # fmt: skip
        head.save(cfg.out, meta)

    t1 = time.perf_counter()
    bar = tqdm(total=planned, initial=step, desc="eagle head", unit="step", disable=not progress)
    head.train()
    while step < planned:
        if cfg.max_minutes is not None and time.perf_counter() - t0 > cfg.max_minutes * 60:
            log(f"stopping at step {step}: --max-minutes {cfg.max_minutes} reached")
            break
        S = 1 if step < cfg.rollout_warmup * planned else cfg.rollout  # one step learns fastest; then the rollout
        objective = _objective(head, train_s, cfg, S, sub_of, precision, device, gen)
        loss = optimizer_step(objective, head.parameters(), opt, sched)
        step += 1
        losses.append(round(loss, 4))
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}")
        if step % cfg.checkpoint_every == 0:
            evals.append((step, round(head_agreement(head, eval_s)[0], 4)))
            save()
            bar.write(f"step {step}: loss {loss:.3f}, held-out agreement {evals[-1][1]:.1%}")
    bar.close()
    t_train = time.perf_counter() - t1
    per_step = head_agreement(head, eval_s, cfg.rollout)
    if not evals or evals[-1][0] != step:
        evals.append((step, round(per_step[0], 4)))
    meta["trained"]["seconds"] = round(time.perf_counter() - t0, 1)
    meta["trained"]["agreement"] = round(per_step[0], 4)
    save()
    report = EagleReport(
        out=str(cfg.out), feature_layers=list(layers), examples=len(train_s) if examples is None else examples,
        eval_examples=len(eval_s), train_tokens=sum(int(s.tokens.numel()) for s in train_s),
        vocab_subset=int(vocab_ids.numel()), subset_coverage=round(coverage, 4), steps=step,
        agreement_before=round(before, 4), agreement_after=round(per_step[0], 4),
        agreement_per_step=[round(a, 4) for a in per_step], seconds_data=round(t_data, 1),
        seconds_train=round(t_train, 1), seconds_total=round(time.perf_counter() - t0, 1), precision=precision,
        evals=evals, losses=losses,
    )  # fmt: skip
    (cfg.out / "distill.json").write_text(json.dumps({"config": jsonable(asdict(cfg)), "report": asdict(report)}, indent=2))
    log(f"head agreement with the target on held-out continuations: {before:.1%} -> {per_step[0]:.1%} "
        f"(rollout steps {', '.join(f'{a:.1%}' for a in per_step)}); wrote {cfg.out}")  # fmt: skip
    return report
