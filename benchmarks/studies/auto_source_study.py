"""Offline: at every position of the target's greedy answers, what lookup and the draft head would
each get accepted, and how strong lookup's match was. Which source should draft where?

`auto` gives a round to lookup (suffix tree + n-gram) when it proposes at least ``min_lookup`` (3)
tokens, else to the draft head. This replays every output position of plain decoding's answers as
a round start: both sources draft K tokens from the same history (the head from the target's true
features), and each draft's accepted length is its common prefix with what the target went on to
write. Lookup's proposals are bucketed by the length of the context match behind them (the n-gram
length, or the suffix tree's match length), so a rule such as "lookup keeps the turn only on a match
of at least m tokens" can be scored before it is built. Each row also records the evidence behind
lookup's draft: whether the suffix tree copied it from earlier requests' outputs (its global trie)
and on how long a context match, its count-based score, where in the history it was copied from,
and the head's probability of its first token. Greedy; native kernels; one process.

The policies are then replayed as rounds over those positions (a round drafts K = --k from the
position it starts at and moves past what it emitted), priced with this CPU's forward(n)/forward(1),
measured here, plus the head's step (``--head-step``, a share of a one-token forward; pass
``--json`` of an earlier run as ``--rows`` to replay it without the target). A model, not the
engine: no goodput controller (K is fixed), no catch-up costs; it ranks rules, the bench decides.

    .venv/bin/python benchmarks/studies/auto_source_study.py --prompts benchmarks/prompts/heldout.jsonl --json out.json
    .venv/bin/python benchmarks/studies/auto_source_study.py --rows out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from draftgate.bench.prompts import builtin_prompts_path, load_prompts
from draftgate.drafters.base import DraftRequest
from draftgate.drafters.eagle import EagleDrafter, load_head
from draftgate.drafters.ngram import NgramDrafter
from draftgate.drafters.suffix import SuffixDrafter, SuffixMatch
from draftgate.models.loader import load_model
from draftgate.models.native import load_library
from draftgate.models.runner import ForwardItem, ModelRunner
from draftgate.paths import default_cache_dir
from draftgate.types import SamplingParams

GREEDY = SamplingParams()


def _ngram_match(d: NgramDrafter, seq: int, tokens: list[int], k: int) -> tuple[list[int], int]:
    """The n-gram draft and the length n of the match behind it (0: none)."""
    index = d._sync(seq, tokens)
    hist = index.tokens
    for n in range(min(d.max_n, len(hist) - 1), d.min_n - 1, -1):
        if index.last_end.get(tuple(hist[len(hist) - n :])) is not None:
            return d._lookup(index, k), n
    return [], 0


def _suffix_match(d: SuffixDrafter, seq: int, tokens: list[int], k: int) -> tuple[SuffixMatch, int]:
    """The suffix draft with its evidence, and the length of the request's longest context match
    (its trie's active depth)."""
    sm = d.match(seq, tokens, k)
    return sm, len(d._reqs[seq].active)


def _suffix_score(d: SuffixDrafter, seq: int, tokens: list[int], k: int) -> float:
    """The request trie's expected accepted length for its draft (count-based; 0: no match)."""
    req = d._sync(seq, tokens)
    m = min(len(req.active), max(1, d.max_depth - k))
    return req.trie.walk((req.active[m - 1], 0, m), k, d.min_prob)[1] if m > 0 else 0.0


def _match_origin(tokens: list[int], draft: list[int], match: int) -> int:
    """Where lookup's draft was copied from: the latest earlier position i with
    tokens[i - m: i] == the history's last m tokens (m = min(match, 8)) and tokens[i] == draft[0];
    -1 if none (a global-trie match, or an overlapping copy)."""
    if not draft or match <= 0:
        return -1
    m, n = min(match, 8), len(tokens)
    ctx = tokens[n - m :]
    for i in range(n - 1, m - 1, -1):
        if tokens[i] == draft[0] and tokens[i - m : i] == ctx:
            return i
    return -1


def _accepted(draft: list[int], truth: list[int]) -> int:
    a = 0
    while a < len(draft) and a < len(truth) and draft[a] == truth[a]:
        a += 1
    return a


@torch.inference_mode()
def study(prompt_files: list[str], k: int, max_new: int) -> list[dict]:
    target = load_model("smollm2-135m", cache_dir=default_cache_dir())
    runner = ModelRunner(target, num_blocks=512, enable_prefix_cache=False)
    head = load_head(None, target).use_native(load_library(default_cache_dir()))
    eagle, suffix, ngram = EagleDrafter(head), SuffixDrafter(), NgramDrafter(min_n=2)
    layers = head.feature_layers
    eos = set(target.config.eos_token_ids)
    rows: list[dict] = []
    seq = 0
    for path in prompt_files:
        for p in load_prompts(path):
            seq += 1
            prompt = target.tokenizer.encode_chat(p.messages(0, []))
            last = runner.prefill(seq, prompt)
            out = [int(last.argmax())]
            while len(out) < max_new and out[-1] not in eos:  # plain greedy decoding
                out.append(int(runner.forward([ForwardItem(seq, [out[-1]])])[0][-1].argmax()))
            runner.free(seq)
            hist = prompt + out
            _, start, feats = runner.prefill_features(seq, hist, layers)  # [len(hist), nF, C], every position
            runner.free(seq)
            assert start == 0
            fed = 0
            P = len(prompt)
            for t in range(P, len(hist) - 1):  # round start: pending token hist[t]
                tokens = hist[: t + 1]
                eagle.feed(seq, fed, feats[fed:t])  # committed: positions < t
                fed = t
                truth = hist[t + 1 : t + 1 + k]
                nd, nn = _ngram_match(ngram, seq, tokens, k)
                sm, sn = _suffix_match(suffix, seq, tokens, k)
                sd = sm.token_ids
                look, strength = (sd, sn) if len(sd) >= len(nd) else (nd, nn)
                hd = eagle.propose([DraftRequest(seq, tokens, k, GREEDY)])[0]
                first = eagle._seqs[seq].last_logits  # [Vs] the head's first draft step (its confidence)
                p1 = float(torch.softmax(first, -1).max()) if first is not None else 0.0
                tree_hit = any(
                    parent == _accepted(hd.token_ids, truth) and tok == truth[parent]
                    for parent, tok in hd.tree
                    if parent < len(truth)
                )
                src_pos = _match_origin(tokens, look, strength)
                q_look = 0.0
                if first is not None and look:
                    at = (head.vocab_ids == look[0]).nonzero()
                    q_look = float(torch.softmax(first, -1)[int(at[0, 0])]) if at.numel() else 0.0
                rows.append(
                    {
                        "category": p.category,
                        "prompt": f"{Path(path).stem}:{p.id}",
                        "t": t - P,
                        "lookup_len": len(look),
                        "lookup_acc": _accepted(look, truth),
                        "match": strength,
                        "ngram_n": nn,
                        "suffix_depth": sn,
                        "head_len": len(hd.token_ids),
                        "head_acc": _accepted(hd.token_ids, truth) + int(tree_hit),
                        "head_leaves": len(hd.tree),
                        "head_p1": round(p1, 4),
                        "same_first": bool(look and hd.token_ids and look[0] == hd.token_ids[0]),
                        "prompt_len": P,
                        "from_suffix": len(sd) >= len(nd) and bool(sd),
                        "suffix_score": round(_suffix_score(suffix, seq, tokens, k), 4),
                        "origin": src_pos,
                        "head_q_look": round(q_look, 4),
                        "suffix_global": sm.from_global,
                        "suffix_match_depth": sm.depth,
                    }
                )
            for d in (eagle, suffix, ngram):
                d.release(seq)
    return rows


def summarize(rows: list[dict], min_lookup: int = 3) -> None:
    """Per category: rounds lookup keeps today (>= min_lookup tokens), by match length: lookup's and
    the head's mean accepted there."""
    cats: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        cats[r["category"]].append(r)
    print("| category | positions | lookup keeps the turn | match | n | lookup acc | head acc |")
    print("|---|---:|---:|---|---:|---:|---:|")
    buckets = {"2-3": lambda m: m <= 3, "4-7": lambda m: 4 <= m <= 7, "8+": lambda m: m >= 8}
    for cat, rs in sorted(cats.items()):
        kept = [r for r in rs if r["lookup_len"] >= min_lookup]
        for name, f in buckets.items():
            b = [r for r in kept if f(r["match"])]
            if b:
                la = sum(r["lookup_acc"] for r in b) / len(b)
                ha = sum(r["head_acc"] for r in b) / len(b)
                print(f"| {cat} | {len(rs)} | {len(kept)} | {name} | {len(b)} | {la:.2f} | {ha:.2f} |")


Policy = Callable[[dict, dict], str]  # (position row, running means) -> lookup | probed lookup | head | both | none


def _current(r: dict, st: dict) -> str:  # auto today: lookup on >= 3 proposed tokens
    return "lookup" if r["lookup_len"] >= 3 else "head"


def _long_match(r: dict, st: dict) -> str:  # lookup keeps the turn on a match of >= 4 tokens only
    return "lookup" if r["lookup_len"] >= 3 and r["match"] >= 4 else "head"


def _running(r: dict, st: dict, w: float = 4.0) -> str:
    """Short-match lookup drafts against the head by each one's running mean accepted in this
    request (priors 1.0 and 0.6, worth w rounds each)."""
    if r["lookup_len"] < 3 or r["match"] >= 4:
        return _current(r, st)
    el = (st["short"][0] + 1.0 * w) / (st["short"][1] + w)
    eh = (st["head"][0] + 0.6 * w) / (st["head"][1] + w)
    return "lookup" if el >= eh else "head"


def _confident_head(r: dict, st: dict, p1: float = 0.5) -> str:
    """At a short-match lookup turn the head takes its first step; it drafts if it is at least p1
    sure of a first token other than lookup's (else lookup drafts, having paid for that step)."""
    if r["lookup_len"] < 3 or r["match"] >= 4:
        return _current(r, st)
    return "head" if r["head_p1"] >= p1 and not r["same_first"] else "probed lookup"


def _both(r: dict, st: dict) -> str:  # a short-match lookup round also carries the head's chain (one tree)
    return "both" if r["lookup_len"] >= 3 and r["match"] <= 3 else _current(r, st)


def _own_evidence(r: dict, st: dict) -> str:
    """auto as it is: a suffix draft copied from earlier requests (the global trie)
    on a context match under 4 tokens does not count toward lookup's turn (the n-gram's still does)."""
    if r.get("suffix_global") and r["from_suffix"] and r["suffix_match_depth"] < 4:
        return "lookup" if r["ngram_n"] else "head"  # an n-gram match drafts K tokens
    return _current(r, st)


POLICIES: dict[str, Policy] = {
    "lookup only (auto, --draft-head none)": lambda r, st: "lookup" if r["lookup_len"] else "none",
    "head only (eagle)": lambda r, st: "head",
    "auto today: lookup on >= 3 tokens": _current,
    "lookup only on a match >= 4": _long_match,
    "short matches by running means": _running,
    "short matches: the head's if it is >= 0.5 sure of another first token": _confident_head,
    "short matches: lookup + head in one tree": _both,
    "global-trie drafts on a match < 4 do not keep the turn (auto now)": _own_evidence,
    "oracle (the better of the two)": lambda r, st: (
        "lookup" if r["lookup_acc"] >= r["head_acc"] and r["lookup_len"] else "head"
    ),
}


def replay(rows: list[dict], policy: Policy, fwd: list[float], head_step: float) -> dict[str, float]:
    """Tokens per unit of time (plain decoding = 1) per category, the policy's rounds replayed."""
    per: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        per[r["prompt"]].append(r)
    tot: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    price = lambda n: fwd[min(n, len(fwd) - 1)]  # noqa: E731
    head_rows = lambda r: 1 + r["head_len"] + r["head_leaves"]  # noqa: E731
    for rs in per.values():
        rs.sort(key=lambda r: r["t"])
        st = {"short": [0.0, 0], "head": [0.0, 0]}
        i = 0
        while i < len(rs):
            r = rs[i]
            src = policy(r, st)
            if src in ("lookup", "probed lookup"):
                a, t = r["lookup_acc"], price(1 + r["lookup_len"]) + (head_step if src == "probed lookup" else 0.0)
                if r["lookup_len"] >= 3 and r["match"] <= 3:
                    st["short"][0] += a
                    st["short"][1] += 1
            elif src == "head":
                a, t = r["head_acc"], price(head_rows(r)) + head_step * max(1, r["head_len"])
                st["head"][0] += a
                st["head"][1] += 1
            elif src == "both":
                a = max(r["lookup_acc"], r["head_acc"])
                t = price(head_rows(r) + r["lookup_len"]) + head_step * max(1, r["head_len"])
            else:
                a, t = 0, 1.0
            tot[r["category"]][0] += a + 1
            tot[r["category"]][1] += t
            i += a + 1
    return {c: v[0] / v[1] for c, v in tot.items()}


@torch.inference_mode()
def forward_costs(widths: int = 13, reps: int = 7) -> list[float]:
    """forward(n) / forward(1) for n = 0..widths at context ~200 (index 0 unused), medians."""
    target = load_model("smollm2-135m", cache_dir=default_cache_dir())
    runner = ModelRunner(target, num_blocks=64, enable_prefix_cache=False)
    runner.prefill(1, list(range(100, 300)))
    times: dict[int, list[float]] = defaultdict(list)
    for _ in range(reps):
        for n in range(1, widths + 1):
            t = time.perf_counter()
            runner.forward([ForwardItem(1, list(range(7, 7 + n)), 1)])
            times[n].append(time.perf_counter() - t)
            runner.truncate(1, 200)
    one = statistics.median(times[1])
    return [1.0] + [statistics.median(times[n]) / one for n in range(1, widths + 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", nargs="+", default=[str(builtin_prompts_path())])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path, default=None, help="write the per-position rows here")
    ap.add_argument("--rows", type=Path, default=None, help="replay the rows of an earlier --json (no target run)")
    ap.add_argument(
        "--head-step", type=float, default=0.047, help="a head step, in one-token forwards (eagle_step_cost.py)"
    )
    a = ap.parse_args()
    rows = json.loads(a.rows.read_text()) if a.rows is not None else study(a.prompts, a.k, a.max_new_tokens)
    if a.json is not None:
        a.json.write_text(json.dumps(rows))
    summarize(rows)
    fwd = forward_costs()
    print("\nforward(n)/forward(1), n = 1..13: " + ", ".join(f"{x:.2f}" for x in fwd[1:]))
    results = {name: replay(rows, pol, fwd, a.head_step) for name, pol in POLICIES.items()}
    cats = sorted({r["category"] for r in rows})
    print("\n| policy (modelled tokens per time, plain = 1) | " + " | ".join(cats) + " |")
    print("|---|" + "---:|" * len(cats))
    for name, res in results.items():
        print(f"| {name} | " + " | ".join(f"{res[c]:.2f}" for c in cats) + " |")


if __name__ == "__main__":
    main()
