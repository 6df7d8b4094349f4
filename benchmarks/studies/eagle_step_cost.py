"""Cost of one draft-head step against one one-token target forward (goal: <= 8%).

Both on the bundled SmolLM2 in this process (one library, one thread pool), interleaved, run from
a thread that is not the one that built the model (as the engine's loop):
a decode step of the target (the native runner, one token, a context of --ctx tokens) and one
chain step of the head (one entry over a head cache of the same length, its logits and the
argmax), medians over --reps. Also the whole draft of K tokens as the engine runs it (one
absorbing pass over the tokens committed last round + K - 1 chain steps).

  .venv/bin/python benchmarks/studies/eagle_step_cost.py [--head DIR] [--ctx 200] [--reps 200] [--torch-products]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from draftgate.drafters.base import DraftRequest
from draftgate.drafters.eagle import EagleDrafter, load_head
from draftgate.models.loader import load_model
from draftgate.models.native import load_library
from draftgate.models.runner import ForwardItem, ModelRunner
from draftgate.paths import default_cache_dir
from draftgate.types import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", default=None, help="head folder (default: the one shipped for the model)")
    ap.add_argument("--ctx", type=int, default=200)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--dtype", default="bfloat16", help="the native products' weight dtype")
    ap.add_argument(
        "--torch-products", action="store_true", help="the head's products on torch (float32), not native bf16"
    )
    a = ap.parse_args()
    target = load_model("smollm2-135m")
    runner = ModelRunner(target, num_blocks=64)
    head = load_head(a.head, target)
    if not a.torch_products:  # what the engine drafts with (engine/factory.py)
        head.use_native(load_library(default_cache_dir()), getattr(torch, a.dtype))
    drafter = EagleDrafter(head)
    # As in the engine: the model is built here, every forward and draft runs in another thread.
    th = threading.Thread(target=_measure, args=(a, target, runner, head, drafter))
    th.start()
    th.join()


def _measure(a: argparse.Namespace, target, runner: ModelRunner, head, drafter: EagleDrafter) -> None:  # noqa: ANN001
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.config.vocab_size, (a.ctx,), generator=g).tolist()
    runner.prefill(0, prompt)
    C, nF = target.config.hidden_size, len(head.feature_layers)
    feats = torch.randn(a.ctx, nF, C, generator=g)  # [ctx, nF, C]
    drafter.feed(1, 0, feats)
    last2 = feats[-2:]
    tokens = prompt + [5]
    req = DraftRequest(1, tokens, a.k, SamplingParams(max_new_tokens=64))
    drafter.propose([req])  # builds the head cache over the context
    seq = drafter._seqs[1]
    assert seq.cache is not None and seq.last_h is not None
    t_fwd, t_step, t_draft = [], [], []
    for i in range(a.reps + 10):
        t0 = time.perf_counter()
        runner.forward_flat([ForwardItem(0, [7])])
        t1 = time.perf_counter()
        runner.truncate(0, a.ctx)
        with torch.inference_mode():
            n = seq.cache.n
            _, logits = head.step(seq.cache, torch.tensor([11]), g=seq.last_h[None])
            int(logits.argmax())
            head.truncate(seq.cache, n)
        t2 = time.perf_counter()
        # A whole K-token draft after a round that committed 2 positions.
        head.truncate(seq.cache, n - 2)
        seq.g_start, seq.g_n = n - 2, 0  # the drafter keeps only unabsorbed features: hand it those 2 again
        drafter.feed(1, n - 2, last2)
        drafter.propose([req])
        t3 = time.perf_counter()
        if i >= 10:
            t_fwd.append(t1 - t0)
            t_step.append(t2 - t1)
            t_draft.append(t3 - t2)
    f, s, d = (statistics.median(x) * 1e3 for x in (t_fwd, t_step, t_draft))
    print(f"threads {torch.get_num_threads()}, context {a.ctx}, head vocab {head.vocab_ids.numel()}")
    print(f"one-token target forward   {f:7.3f} ms")
    print(f"one head chain step        {s:7.3f} ms  = {s / f:.1%} of a target forward (goal <= 8%)")
    print(f"a K={a.k} draft (2 absorbed)  {d:7.3f} ms  = {d / f:.1%} of a target forward")


if __name__ == "__main__":
    main()
