"""Plain greedy decoding: our engine vs Hugging Face generate(), same weights, prompts and threads.

Interleaved (ours, HF, ours, HF ...) so a drifting shared machine hits both arms alike.
Also reports ms/token against the physical floor: bytes of weights read per token
divided by this machine's measured matrix-vector bandwidth.

    .venv/bin/python benchmarks/plain_vs_hf.py --runs 3 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from draftgate.cli.common import default_cache_dir
from draftgate.engine import DrafterKind, EngineConfig, build_engine
from draftgate.models.loader import load_model
from draftgate.types import SamplingParams

PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a bicycle works to a child.",
]


def hf_model(loaded):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig, LlamaForCausalLM

    m = LlamaForCausalLM(LlamaConfig(**loaded.config.to_hf()))
    m.load_state_dict(loaded.weights, strict=False)
    m.tie_weights()
    return m.eval()


def measure_bandwidth() -> float:
    """GB/s of an fp32 matrix-vector product over a 1 GiB matrix (the decode access pattern)."""
    a = torch.randn(16384, 16384)
    x = torch.randn(16384)
    torch.mv(a, x)
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        torch.mv(a, x)
        ts.append(time.perf_counter() - t)
    return a.numel() * 4 / statistics.median(ts) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    loaded = load_model("smollm2-135m", cache_dir=default_cache_dir())
    engine = build_engine(EngineConfig(drafter=DrafterKind.NONE), loaded=loaded)
    hf = hf_model(loaded)
    tok = loaded.tokenizer
    params = SamplingParams(max_new_tokens=a.max_new_tokens, ignore_eos=True)
    ours_ms: list[float] = []
    hf_ms: list[float] = []
    for r in range(a.runs):
        for p in PROMPTS:
            ids = engine.encode(p)
            c = engine.complete(ids, params)
            # decode time only: subtract the time to the first token (prefill)
            ours_ms.append((c.elapsed_s - c.first_token_s) / (c.completion_tokens - 1) * 1e3)
            x = torch.tensor([ids])
            with torch.inference_mode():
                t0 = time.perf_counter()
                hf.generate(x, max_new_tokens=1, min_new_tokens=1, do_sample=False)
                t1 = time.perf_counter()
                out = hf.generate(
                    x, max_new_tokens=a.max_new_tokens, min_new_tokens=a.max_new_tokens, do_sample=False
                )
                t2 = time.perf_counter()
            n = out.shape[1] - x.shape[1]
            hf_ms.append(((t2 - t1) - (t1 - t0)) / (n - 1) * 1e3)
            same = out[0, x.shape[1] :].tolist() == c.token_ids[:n]
            print(f"run {r} {p[:30]!r}: ours {ours_ms[-1]:.1f} ms/tok, HF {hf_ms[-1]:.1f} ms/tok, same={same}",
                  file=sys.stderr, flush=True)
    engine.shutdown()
    bw = measure_bandwidth()
    cfg = loaded.config
    nbytes = (cfg.num_params) * 4  # fp32, the tied lm_head read once more than the embedding rows
    floor = nbytes / (bw * 1e9) * 1e3
    o, h = statistics.median(ours_ms), statistics.median(hf_ms)
    print(f"| arm | ms/token (median of {len(ours_ms)}) | tok/s |")
    print("|---|---|---|")
    print(f"| DraftGate plain (fp32) | {o:.1f} | {1e3 / o:.1f} |")
    print(f"| HF transformers generate() (fp32) | {h:.1f} | {1e3 / h:.1f} |")
    print(f"\nratio ours/HF speed: **{h / o:.2f}x**; weights read per token {nbytes / 1e6:.0f} MB; "
          f"measured mv bandwidth {bw:.1f} GB/s -> floor {floor:.1f} ms/token; ours is {o / floor:.2f}x the floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
