"""Where an engine step's time goes beyond the forward itself, at batch 1.

Runs plain decoding (or --drafter D) through the real Engine and splits each token's time into:
the native forward (the C++ call, from its own phase clock), the runner's Python around it
(building the ragged batch, the ctypes call, splitting logits) and the engine's bookkeeping
(drafting, verification, controller, stop checks, detokenization, stats, the hand-off to the
caller). Then a cProfile of the engine thread lists the Python functions the bookkeeping spends
its time in (profiling slows Python down, so only its shares are meaningful).

    .venv/bin/python benchmarks/studies/step_overhead.py --tokens 128
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys

import torch

from draftgate.engine import DrafterKind, EngineConfig, build_engine
from draftgate.models.native_llama import NativeLlama, profile
from draftgate.paths import default_cache_dir
from draftgate.types import SamplingParams

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--drafter", default="none", choices=[d.value for d in DrafterKind])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt", default=PROMPT, help="the request's prompt (default: a short story)")
    ap.add_argument("--k-max", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kernel-level", default=None, help="force a kernel level (default: the CPU's best)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    engine = build_engine(
        EngineConfig(
            drafter=DrafterKind(a.drafter), k_max=a.k_max, cache_dir=default_cache_dir(), kernel_level=a.kernel_level
        )
    )
    assert isinstance(engine.runner.model, NativeLlama), "this profile is of the native forward"
    lib = engine.runner.model.lib
    ids = engine.encode(a.prompt)
    params = SamplingParams(max_new_tokens=a.tokens, ignore_eos=True)
    engine.complete(ids, params)  # warm-up
    rows = []
    for _ in range(a.runs):
        engine.forget_finished()  # each run drafts from the same memory, not from the last run's answer
        box = {}

        def run(box=box) -> None:  # noqa: ANN001
            box["c"] = engine.complete(ids, params)

        phases = profile(lib, run)
        c = box["c"]
        rounds = c.stats.rounds
        decode_s = c.elapsed_s - c.first_token_s
        native_ms = sum(phases.values()) / (rounds + 1) * 1e3  # + 1: the prefill ran a forward too
        forward_ms = c.stats.verify_time_s / rounds * 1e3
        step_ms = decode_s / rounds * 1e3
        rows.append((step_ms, forward_ms, native_ms, c.completion_tokens / decode_s))
    step, fwd, nat, tps = (sorted(col)[len(col) // 2] for col in zip(*rows, strict=True))
    print(
        f"drafter {a.drafter}, {a.tokens} tokens, batch 1, median of {a.runs} runs: {tps:.1f} tok/s decode, "
        f"{c.stats.mean_accepted_length:.2f} tokens per round\n"
    )
    print("| part of a step | ms | share of the one-token forward |")
    print("|---|---:|---:|")
    print(f"| native forward (C++) | {nat:.2f} | 100% |")
    print(f"| runner Python around it (batch, ctypes, logits) | {fwd - nat:.2f} | {(fwd - nat) / nat:.1%} |")
    print(
        f"| engine bookkeeping (draft, verify, controller, stop, detok, stats, hand-off) | {step - fwd:.2f} "
        f"| {(step - fwd) / nat:.1%} |"
    )
    print(f"| **all overhead** | **{step - nat:.2f}** | **{(step - nat) / nat:.1%}** |")

    # Which Python functions the engine thread spends its time in (cProfile around each turn).
    prof = cProfile.Profile()
    turn = engine._turn

    def profiled_turn() -> None:
        prof.enable()
        try:
            turn()
        finally:
            prof.disable()

    engine._turn = profiled_turn  # type: ignore[method-assign]
    engine.complete(ids, params)
    engine.shutdown()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(15)
    print("\ncProfile of the engine thread (sorted by own time; profiling inflates Python):\n")
    print("```")
    print("\n".join(line for line in s.getvalue().splitlines() if line.strip())[:4000])
    print("```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
