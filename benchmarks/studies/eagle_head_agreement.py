"""Held-out agreement of draft heads with the target, per prompt category and rollout step.

The target's greedy continuations of each prompt file are generated once (with the features and
logits ``distill --kind eagle`` records), then every head is scored on them as ``distill`` scores
its eval set: the share of generated positions where the head's greedy token, drafted from the
target's true features (step 1) or from its own step-1 state (step 2), is the target's token.

``--full-vocab`` also scores each head with every output row of the target instead of its
vocabulary subset (the rows are the target's own and frozen, so no retraining is needed), and
reports the share of the target's tokens the subset covers: whether the subset is what limits
agreement.

    python benchmarks/studies/eagle_head_agreement.py --heads src/draftgate/data/heads/smollm2-135m heads/other \\
        --prompts src/draftgate/data/chat_eval.jsonl benchmarks/prompts/heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from draftgate.models.eagle import EagleHead, default_feature_layers
from draftgate.models.loader import load_model
from draftgate.train.data import read_records
from draftgate.train.eagle import head_agreement
from draftgate.train.states import generate_states


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--heads", type=Path, nargs="+", required=True, help="head folders (head.json + head.safetensors)")
    ap.add_argument(
        "--prompts",
        type=Path,
        nargs="+",
        required=True,
        help="JSONL prompt files; rows with a category are split by it",
    )
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=2, help="rollout steps to score (default: %(default)s)")
    ap.add_argument(
        "--full-vocab",
        action="store_true",
        help="also score every head over the whole vocabulary, and the subsets' coverage",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the table here")
    a = ap.parse_args()

    target = load_model(a.target)
    layers = default_feature_layers(target.config.num_layers)
    groups: dict[str, list] = defaultdict(list)  # "file:category" -> states
    for path in a.prompts:
        records = read_records(path)
        cats = [json.loads(line).get("category", "all") for line in path.read_text().splitlines() if line.strip()]
        states = generate_states(target, records, layers, top_k=1, max_new_tokens=a.max_new_tokens, max_len=512)
        if len(states) != len(cats):
            raise SystemExit(
                f"{path}: {len(cats)} rows but {len(states)} usable prompts; shorten or drop the long ones"
            )
        for s, c in zip(states, cats, strict=True):
            groups[f"{path.stem}:{c}"].append(s)
    heads = {str(h): EagleHead.load(h, target.config, target.weights) for h in a.heads}
    subsets: dict[str, set[int]] = {}  # head -> its vocabulary subset (--full-vocab: the coverage column)
    if a.full_vocab:
        subsets = {name: set(head.vocab_ids.tolist()) for name, head in heads.items()}
        for h in a.heads:
            full = EagleHead.load(h, target.config, target.weights)
            full.vocab_ids = torch.arange(target.config.vocab_size)  # [V] every row of the target
            heads[f"{h} (full vocab)"] = full.attach_target(target.weights)
    table = {}
    cols = [*heads, *(f"{h}: subset coverage" for h in subsets)]
    print("| set | tokens | " + " | ".join(cols) + " |")
    print("|---|---:|" + "---|" * len(cols))
    for name, states in sorted(groups.items()):
        tokens = sum(int(s.tokens.numel()) - s.start for s in states)
        with torch.inference_mode():
            row = {h: head_agreement(head, states, a.steps) for h, head in heads.items()}
        table[name] = {"tokens": tokens, **row}
        cells = " | ".join(" / ".join(f"{x:.3f}" for x in row[h]) for h in heads)
        if subsets:
            generated = [t for s in states for t in s.tokens[s.start :].tolist()]  # the target's tokens
            cover = {h: sum(t in ids for t in generated) / max(1, len(generated)) for h, ids in subsets.items()}
            table[name]["subset_coverage"] = cover
            cells += " | " + " | ".join(f"{c:.3f}" for c in cover.values())
        print(f"| {name} | {tokens} | {cells} |")
    if a.json is not None:
        a.json.write_text(json.dumps(table, indent=2) + "\n")


if __name__ == "__main__":
    main()
