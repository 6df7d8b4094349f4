"""Batch invariance of a forward implementation, measured: does a position's logit row depend on
how many rows share its pass?

Greedy speculation is token for token plain decoding only when the logits a verify pass computes
for a position are the ones a one-token decode computes there (batch invariance, docs/ARCHITECTURE.md). The native CPU
kernels are bitwise invariant by construction (tests/models/test_invariance.py); PyTorch's kernels
(``--kernels torch``, and every CUDA run) are not by construction. This probe measures how far
they are: it decodes a prompt's greedy continuation one token a forward (the reference), then
recomputes the same positions in passes of n rows (a verify pass of K = n - 1 drafts) and in a
batch of several sequences, and reports per pass shape the largest logit difference, the share of
bitwise-equal rows and the rows whose argmax moved.

    .venv/bin/python benchmarks/invariance_probe.py                      # native kernels (expect 0)
    .venv/bin/python benchmarks/invariance_probe.py --kernels torch
    python benchmarks/invariance_probe.py --device cuda --dtype float32  # on a GPU
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from draftgate.engine.config import DTYPES
from draftgate.models.loader import load_model
from draftgate.models.runner import ForwardItem, Kernels, ModelRunner
from draftgate.paths import default_cache_dir

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def _decode(runner: ModelRunner, sid: int, prompt: list[int], n_new: int) -> tuple[list[int], torch.Tensor]:
    """Plain greedy decoding: the continuation [n_new] and each step's logits [n_new, V] (row i: after token i)."""
    last = runner.prefill(sid, prompt)
    toks, rows = [], []
    nxt = int(last.argmax())
    for _ in range(n_new):
        toks.append(nxt)
        lg = runner.forward([ForwardItem(sid, [nxt])])[0][-1]  # [V]
        rows.append(lg.float().cpu())
        nxt = int(lg.argmax())
    runner.free(sid)
    return toks, torch.stack(rows)


def _compare(ref: torch.Tensor, got: torch.Tensor) -> dict:
    """ref, got [n, V] -> the largest |difference|, bitwise-equal rows, argmax moved."""
    diff = (ref - got).abs().amax(dim=-1)  # [n]
    return {
        "rows": int(ref.shape[0]),
        "max_abs_diff": float(diff.max()),
        "bitwise_equal_rows": int((diff == 0).sum()),
        "argmax_moved": int((ref.argmax(-1) != got.argmax(-1)).sum()),
    }


@torch.inference_mode()
def probe(runner: ModelRunner, prompt: list[int], n_new: int, widths: list[int], batch: int) -> list[dict]:
    toks, ref = _decode(runner, 1, prompt, n_new)
    out = []
    for n in widths:  # verify passes of n rows over the same continuation
        runner.prefill(2, prompt)
        got = []
        for a in range(0, n_new, n):
            piece = toks[a : a + n]
            got.append(runner.forward([ForwardItem(2, piece, len(piece))])[0].float().cpu())
        runner.free(2)
        out.append({"pass": f"{n} rows of one sequence", **_compare(ref, torch.cat(got))})
    # ``batch`` sequences decoding side by side, one row each: row 0 is the reference sequence.
    sids = list(range(10, 10 + batch))
    for s in sids:
        runner.prefill(s, prompt)
    got = []
    for t in toks:
        got.append(runner.forward([ForwardItem(s, [t]) for s in sids])[0][-1].float().cpu())
    for s in sids:
        runner.free(s)
    out.append({"pass": f"1 row each of {batch} sequences", **_compare(ref, torch.stack(got))})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--kernels", default="auto", choices=[k.value for k in Kernels])
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--widths", default="2,5,9", help="rows per verify pass (comma-separated)")
    ap.add_argument("--batch", type=int, default=4, help="sequences decoding side by side")
    ap.add_argument("--json", type=Path, default=None, help="also write the result here")
    a = ap.parse_args()
    loaded = load_model(a.model, dtype=DTYPES[a.dtype], cache_dir=default_cache_dir())
    runner = ModelRunner(loaded, a.device, num_blocks=256, enable_prefix_cache=False, kernels=Kernels(a.kernels))
    prompt = loaded.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    rows = probe(runner, prompt, a.new_tokens, [int(w) for w in a.widths.split(",")], a.batch)
    where = f"{runner.device}, kernels {runner.kernels.value}, {a.dtype}"
    print(f"batch invariance: {where}; reference = one-token decode of {a.new_tokens} greedy positions\n")
    print("| pass | rows | max abs logit diff | bitwise-equal rows | argmax moved |\n|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['pass']} | {r['rows']} | {r['max_abs_diff']:.3g} | {r['bitwise_equal_rows']} | {r['argmax_moved']} |"
        )
    if a.json is not None:
        a.json.write_text(json.dumps({"where": where, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
