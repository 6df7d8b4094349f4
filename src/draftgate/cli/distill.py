"""`draftgate distill`: distill a small draft model from the target on the target's own outputs.

It generates the target's greedy continuations for the prompts in --data (or
uses the given texts), stores the target's top-k logits, and trains a small
Llama-family draft with KL(target || draft) on temperature-softened logits plus
cross-entropy. The draft starts from the target's embeddings and evenly spaced
layers and may predict a reduced vocabulary (the target's most frequent tokens;
q is zero elsewhere, which keeps verification exact). Output: an HF-style folder
for `--drafter model --draft-model OUT`.

`--kind eagle` trains an EAGLE-style draft head instead: one decoder layer that reads the
target's own hidden states (low, mid and high layers, fused) and the next token's embedding,
predicts the target's next state and, through the target's output rows for the most frequent
tokens, the token after it. It trains on the target's continuations with KL + cross-entropy over
a multi-step rollout of its own predictions (EAGLE-3's training-time test). Output: a folder
(head.json, head.safetensors) for `--drafter eagle --draft-head OUT` (and auto).

Examples:
  draftgate distill --target smollm2-135m --data src/draftgate/data/chat_train.jsonl \\
      --out drafts/smollm2-chat --layers 4 --steps 300 --max-minutes 30
  draftgate distill --kind eagle --data src/draftgate/data/chat_train.jsonl \\
      src/draftgate/data/chat_written.jsonl src/draftgate/data/translate_train.jsonl \\
      --eval-data src/draftgate/data/chat_eval.jsonl --out heads/smollm2 --steps 1650 \\
      --max-minutes 30     # how the shipped SmolLM2 head was trained (27 min here, bf16 steps)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "distill",
        help="train a small draft model on the target's outputs (KL + cross-entropy)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--target", default="smollm2-135m", help="target model: name, .gguf or HF folder (default: %(default)s)"
    )
    p.add_argument(
        "--kind",
        choices=["model", "eagle"],
        default="model",
        help="model: a small draft LM; eagle: a draft head on the target's hidden states (default: %(default)s)",
    )
    p.add_argument(
        "--data",
        type=Path,
        nargs="+",
        required=True,
        help="JSONL file(s), read in order: one of messages / prompt / turns / text per line",
    )
    p.add_argument(
        "--out",
        type=Path,
        required=True,
        help="output folder (HF-style; eagle: head.json + head.safetensors); also holds the cached "
        "target data and checkpoint.pt",
    )
    p.add_argument(
        "--eval-data",
        type=Path,
        default=None,
        help="eagle: held-out prompts for the agreement (default: 5%% of --data)",
    )
    p.add_argument("--rollout", type=int, default=2, help="eagle: training-time-test steps (default: %(default)s)")
    p.add_argument(
        "--feature-noise",
        type=float,
        default=0.2,
        help="eagle: Gaussian noise on the normalised features while training (default: %(default)s)",
    )
    p.add_argument("--weight-decay", type=float, default=0.05, help="eagle: AdamW weight decay (default: %(default)s)")
    p.add_argument(
        "--feature-loss",
        type=float,
        default=0.0,
        help="eagle: weight of a smooth-L1 regression of the head's predicted state onto the target's "
        "final normed hidden, beside KL + CE (EAGLE-1; default: %(default)s)",
    )
    p.add_argument(
        "--continuations",
        type=int,
        default=1,
        help="eagle: target continuations per training prompt, the greedy one then sampled ones (default: %(default)s)",
    )
    p.add_argument(
        "--sample-temperature",
        type=float,
        default=0.8,
        help="eagle: temperature of the sampled continuations (default: %(default)s)",
    )
    p.add_argument(
        "--rollout-warmup",
        type=float,
        default=0.85,
        help="eagle: share of the steps that train the first draft step alone first (default: %(default)s)",
    )
    p.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="eagle: the training products' precision; bf16 is autocast (float32 weights, optimizer and loss); "
        "auto: bf16 where this CPU runs it at least 1.3x faster (measured at the start) (default: %(default)s)",
    )
    p.add_argument(
        "--device",
        default=None,
        help="eagle: where the target generates the data and the head trains, cpu or cuda[:N] "
        "(default: cuda when this torch sees a GPU, else cpu)",
    )
    p.add_argument(
        "--layers", type=int, default=4, help="draft layers, copied evenly from the target (default: %(default)s)"
    )
    p.add_argument("--hidden", type=int, default=None, help="draft width (default: the target's, initialized from it)")
    p.add_argument(
        "--vocab-subset",
        type=int,
        default=None,
        help="output vocabulary size, 0 = full (model; default 8192; eagle: default 4096)",
    )
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: model 300, eagle 1000)")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default: model 16, eagle 12)")
    p.add_argument(
        "--lr", type=float, default=None, help="peak learning rate, cosine decay (default: model 3e-4, eagle 2e-3)"
    )
    p.add_argument(
        "--temperature", type=float, default=1.0, help="softening temperature for the KL term (default: %(default)s)"
    )
    p.add_argument(
        "--alpha", type=float, default=0.5, help="KL weight; 1-alpha on cross-entropy (default: %(default)s)"
    )
    p.add_argument("--max-new-tokens", type=int, default=128, help="target continuation length (default: %(default)s)")
    p.add_argument("--max-len", type=int, default=512, help="longest training sequence (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=32, help="target logits kept per position (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="data order and init (default: %(default)s)")
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints (default: %(default)s)")
    p.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="stop training after this much wall time in all (data included); eagle: after timing a step, "
        "lays the learning rate and the rollout phase over the steps that fit, at most --steps",
    )
    p.add_argument(
        "--data-share",
        type=float,
        default=0.5,
        help="eagle, with --max-minutes: the most of it spent generating training data; past it no new "
        "prompt starts and the rest of the time trains on what was generated (default: %(default)s)",
    )
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--json", action="store_true", help="print the final report as JSON")
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    a.data = tuple(a.data)
    common = {
        k: getattr(a, k)
        for k in (
            "target",
            "data",
            "out",
            "alpha",
            "max_new_tokens",
            "max_len",
            "top_k",
            "seed",
            "checkpoint_every",
            "max_minutes",
            "resume",
        )
    }
    pick = lambda v, model, eagle: (eagle if a.kind == "eagle" else model) if v is None else v  # noqa: E731
    sizes = {
        "vocab_subset": pick(a.vocab_subset, 8192, 4096),
        "steps": pick(a.steps, 300, 1000),
        "batch": pick(a.batch, 16, 12),
        "lr": pick(a.lr, 3e-4, 2e-3),
    }
    if a.kind == "eagle":
        import torch

        from draftgate.train.eagle import train_eagle
        from draftgate.train.eagle_config import EagleConfig

        cfg_e = EagleConfig(
            **common,
            **sizes,
            eval_data=a.eval_data,
            rollout=a.rollout,
            rollout_warmup=a.rollout_warmup,
            feature_noise=a.feature_noise,
            feature_loss=a.feature_loss,
            data_share=a.data_share,
            weight_decay=a.weight_decay,
            continuations=a.continuations,
            sample_temperature=a.sample_temperature,
            precision=a.precision,
            device=a.device or ("cuda" if torch.cuda.is_available() else "cpu"),
        ).validate()
        report: object = train_eagle(cfg_e, log=(lambda s: None) if a.json else print)
    else:
        if a.device not in (None, "cpu"):
            raise ValueError("--device is for --kind eagle; a draft model trains on the CPU")
        from draftgate.train.distill import DistillConfig, distill

        cfg = DistillConfig(**common, **sizes, layers=a.layers, hidden=a.hidden, temperature=a.temperature).validate()
        report = distill(cfg, log=(lambda s: None) if a.json else print)
    if a.json:
        d = asdict(report)  # type: ignore[call-overload]
        d["losses"] = d["losses"][-5:]
        print(json.dumps(d))
    return 0
