"""Prefill time of long prompts: the model's own quantized weights (``--dtype auto``) against float32.

Both runners live in one process and alternate prompt by prompt, in a thread as the engine runs
them; median over --reps per prompt length (the first repetition is a warm-up).

    .venv/bin/python benchmarks/studies/prefill_cost.py --lengths 128,512,1024 --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from dataclasses import replace

import torch

from draftgate.models.loader import load_model
from draftgate.models.runner import ModelRunner
from draftgate.paths import default_cache_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF model (default: %(default)s)")
    ap.add_argument("--lengths", default="128,512,1024", help="prompt lengths in tokens (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per length (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads (default: %(default)s)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    lengths = [int(n) for n in a.lengths.split(",")]
    quant = load_model(a.model, cache_dir=default_cache_dir(), quantized=True)
    if quant.blocks is None:
        ap.error(f"{a.model} is not a GGUF model: nothing quantized to compare")
    blocks = max(lengths) // 16 + 2
    runners = {
        "float32": ModelRunner(replace(quant, blocks=None), num_blocks=blocks, enable_prefix_cache=False),
        "auto": ModelRunner(quant, num_blocks=blocks, enable_prefix_cache=False),
    }
    times: dict[str, dict[int, list[float]]] = {k: {n: [] for n in lengths} for k in runners}

    def work() -> None:  # in another thread, as the engine runs forwards
        for _ in range(a.reps):
            for n in lengths:
                prompt = [(7 * i) % 1000 + 10 for i in range(n)]
                for name, runner in runners.items():
                    t = time.perf_counter()
                    runner.prefill(1, prompt)
                    times[name][n].append(time.perf_counter() - t)
                    runner.free(1)

    t = threading.Thread(target=work, name="draftgate-engine")
    t.start()
    t.join()
    print("| weights | " + " | ".join(f"{n} tokens" for n in lengths) + " |")
    print("|---|" + "---:|" * len(lengths))
    for name in runners:
        cells = [f"{statistics.median(times[name][n][1:] or times[name][n]) * 1e3:.1f} ms" for n in lengths]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
