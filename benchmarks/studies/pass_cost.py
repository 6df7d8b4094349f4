"""Cost of a forward over n tokens relative to one token, n = 1..17, as the engine runs it.

Measured in a thread the engine way (the main thread loaded and built the model, another thread
runs the forwards), at a fixed context, after warm-up; median of --reps per n, the n interleaved
round by round. ``--kernels torch`` measures PyTorch's CPU kernels the same way (the "before").
Also prints the native forward's phase profile at n = 1 and n = 9.

    .venv/bin/python benchmarks/studies/pass_cost.py                       # native kernels (the default)
    .venv/bin/python benchmarks/studies/pass_cost.py --kernels torch --dtype float32
    .venv/bin/python benchmarks/studies/pass_cost.py --dtype auto --level avx512  # float activations
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import torch

from draftgate.engine.config import DTYPES, DrafterKind, EngineConfig
from draftgate.engine.factory import build_runner
from draftgate.models.loader import load_model
from draftgate.models.native import LEVELS, load_library
from draftgate.models.native_llama import NativeLlama, profile
from draftgate.models.runner import ForwardItem, Kernels, ModelRunner
from draftgate.paths import default_cache_dir


def measure(runner: ModelRunner, widths: list[int], context: int, reps: int, rounds: int) -> dict[int, float]:
    """Median ms per forward of each width, appended at ``context`` and rolled back after each."""
    runner.prefill(1, [(7 * i) % 1000 + 10 for i in range(context)])
    times: dict[int, list[float]] = {n: [] for n in widths}
    for _ in range(2):  # warm-up
        for n in widths:
            runner.forward([ForwardItem(1, [5] * n, n)])
            runner.truncate(1, context)
    for _ in range(rounds):
        for n in widths:
            for _ in range(reps):
                t = time.perf_counter()
                runner.forward([ForwardItem(1, [5] * n, n)])
                times[n].append(time.perf_counter() - t)
                runner.truncate(1, context)
    runner.free(1)
    return {n: statistics.median(ts) * 1e3 for n, ts in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", default="auto", choices=[k.value for k in Kernels])
    ap.add_argument("--dtype", default="float32", choices=list(DTYPES))
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--max-width", type=int, default=17)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--level", default=None, choices=list(LEVELS), help="native kernel level (default: this CPU's best)"
    )
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = EngineConfig(
        drafter=DrafterKind.NONE,
        dtype=a.dtype,
        kernels=Kernels(a.kernels),
        num_blocks=128,
        enable_prefix_cache=False,
        cache_dir=default_cache_dir(),
    ).validate()
    loaded = load_model(cfg.model, dtype=cfg.torch_dtype, cache_dir=cfg.cache_dir, quantized=cfg.quantized)
    runner = build_runner(cfg, loaded)  # built here, in the main thread, as the engine's factory does
    if a.level is not None and isinstance(runner.model, NativeLlama):  # the same weights on another level
        lib = load_library(default_cache_dir(), a.level)
        runner.model = NativeLlama(loaded.config, loaded.weights, lib, loaded.blocks)
    widths = list(range(1, a.max_width + 1))
    out: dict[int, float] = {}
    prof: dict[int, dict[str, float]] = {}

    def engine_thread() -> None:  # the forwards run in another thread, as in Engine
        out.update(measure(runner, widths, a.context, a.reps, a.rounds))
        if isinstance(runner.model, NativeLlama):
            runner.prefill(1, list(range(10, 10 + a.context)))
            for n in (1, 9):

                def run(n: int = n) -> None:
                    for _ in range(10):
                        runner.forward([ForwardItem(1, [5] * n, n)])
                        runner.truncate(1, a.context)

                prof[n] = {k: v / 10 * 1e3 for k, v in profile(runner.model.lib, run).items()}
            runner.free(1)

    t = threading.Thread(target=engine_thread, name="draftgate-engine")
    t.start()
    t.join()
    level = runner.model.lib.level if isinstance(runner.model, NativeLlama) else "-"
    print(
        f"kernels {runner.kernels.value} ({level}), {a.dtype}, context {a.context}, {a.threads} threads, "
        f"median of {a.reps * a.rounds} per width\n"
    )
    print("| n | ms | forward(n)/forward(1) |")
    print("|---:|---:|---:|")
    for n in widths:
        print(f"| {n} | {out[n]:.1f} | {out[n] / out[1]:.2f} |")
    for n, p in prof.items():
        total = sum(p.values())
        parts = ", ".join(f"{k} {v:.2f}" for k, v in p.items())
        print(f"\nphases at n = {n} (ms per forward, {total:.1f} in all): {parts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
