"""How the draft head's held-out agreement grows with its training data (the goal: 0.6).

On the 2-core CPU the data is the bottleneck: the target generates ~330k tokens in the 30-minute
budget, and more steps on them no longer raise the held-out agreement (docs/BENCHMARKS.md,
"Draft head training and agreement"). This measures what more data would buy. The target's
continuations of ``--data`` are generated once with ``--continuations N`` (the greedy one, then
N - 1 sampled at ``--sample-temperature``, per prompt); each multiple m in ``--multiples`` then
trains a fresh head on the greedy continuations plus m - 1 sampled ones per prompt, for
``--steps`` steps at batch ``--batch`` x m, so every run passes over its data the same number of
times. The held-out agreement is measured on the greedy continuations of ``--eval-data``, as
``distill --kind eagle`` does. Meant for a GPU (``--device cuda``); on the CPU use small numbers.

    python benchmarks/studies/eagle_data_scaling.py --device cuda --continuations 4 --multiples 4,1,2 --out scaling
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from draftgate.models.eagle import default_feature_layers
from draftgate.models.loader import load_model
from draftgate.train.data import read_records
from draftgate.train.eagle import train_head
from draftgate.train.eagle_config import EagleConfig
from draftgate.train.states import States, generate_states

DATA = (
    "src/draftgate/data/chat_train.jsonl",
    "src/draftgate/data/chat_written.jsonl",
    "src/draftgate/data/translate_train.jsonl",
)  # the shipped head's data


def _on(s: States, dev: torch.device) -> States:
    return States(s.tokens.to(dev), s.start, s.feats.to(dev), s.top_v.to(dev), s.top_i.to(dev))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--data", nargs="+", default=list(DATA))
    ap.add_argument("--eval-data", default="src/draftgate/data/chat_eval.jsonl")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--continuations", type=int, default=4, help="per prompt: the greedy one, then sampled")
    ap.add_argument("--multiples", default="4,1,2", help="data multiples to train on, in this order")
    ap.add_argument("--steps", type=int, default=1650, help="steps per run (the shipped head: 1650)")
    ap.add_argument("--batch", type=int, default=12, help="sequences a step at 1x (scaled with the multiple)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--budget-minutes", type=float, default=None, help="no new run starts after this")
    ap.add_argument("--out", type=Path, default=Path("eagle-scaling"))
    a = ap.parse_args()
    t0 = time.perf_counter()
    multiples = [int(m) for m in a.multiples.split(",")]
    if max(multiples) > a.continuations or min(multiples) < 1:
        raise SystemExit(f"--multiples must be in 1..--continuations ({a.continuations})")
    dev = torch.device(a.device)
    target = load_model(a.target)
    layers = default_feature_layers(target.config.num_layers)
    data = tuple(Path(p) for p in a.data)
    base = EagleConfig(
        target=a.target,
        data=data,
        out=a.out,
        eval_data=Path(a.eval_data),
        steps=a.steps,
        batch=a.batch,
        max_new_tokens=a.max_new_tokens,
        continuations=a.continuations,
        device=a.device,
    ).validate()
    recs = [r for p in data for r in read_records(p)]
    t = time.perf_counter()
    states = generate_states(
        target,
        recs,
        layers,
        base.top_k,
        a.max_new_tokens,
        base.max_len,
        continuations=a.continuations,
        temperature=base.sample_temperature,
        seed=0,
        batch=256 if dev.type == "cuda" else 32,
        device=dev,
    )
    eval_s = generate_states(
        target,
        read_records(Path(a.eval_data)),
        layers,
        base.top_k,
        a.max_new_tokens,
        base.max_len,
        device=dev,
        progress=False,
    )
    gen_s = time.perf_counter() - t
    tokens = sum(int(s.tokens.numel()) for s in states)
    print(f"data: {len(states)} sequences, {tokens} tokens in {gen_s:.1f} s ({tokens / gen_s:.0f} tokens/s) on {dev}")
    # generate_states keeps the order of its work list: per prompt, its greedy continuation, then the sampled ones.
    per = a.continuations
    assert len(states) % per == 0, "every prompt fits --max-len (no prompt was dropped)"
    on_dev = [_on(s, dev) for s in states]
    eval_dev = [_on(s, dev) for s in eval_s]
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    summary = {
        "device": str(dev),
        "data_sequences": len(states),
        "data_tokens": tokens,
        "data_seconds": round(gen_s, 1),
        "steps": a.steps,
        "batch_1x": a.batch,
        "runs": rows,
    }
    for m in multiples:
        if a.budget_minutes is not None and time.perf_counter() - t0 > a.budget_minutes * 60:
            print(f"skipping {m}x: --budget-minutes {a.budget_minutes} spent")
            continue
        train_s = [s for i, s in enumerate(on_dev) if i % per < m]
        cfg = replace(base, out=a.out / f"x{m}", batch=a.batch * m, continuations=m)
        rep = train_head(cfg, target, train_s, eval_dev, time.perf_counter(), progress=False, log=lambda s: None)
        row = {
            "multiple": m,
            "sequences": len(train_s),
            "tokens": sum(int(s.tokens.numel()) for s in train_s),
            "batch": cfg.batch,
            "steps": rep.steps,
            "agreement": rep.agreement_after,
            "agreement_per_step": rep.agreement_per_step,
            "evals": rep.evals,
            "seconds": rep.seconds_train,
        }
        rows.append(row)
        print(json.dumps(row))
        (a.out / "scaling.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n| data | sequences | tokens | batch x steps | held-out agreement (step 1 / step 2) | train s |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: r["multiple"]):
        a1, a2 = (r["agreement_per_step"] + [float("nan")])[:2]
        print(
            f"| {r['multiple']}x | {r['sequences']} | {r['tokens']} | {r['batch']} x {r['steps']} | "
            f"{a1:.3f} / {a2:.3f} | {r['seconds']:.0f} |"
        )


if __name__ == "__main__":
    main()
