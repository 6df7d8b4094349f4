"""`draftgate demo`: plain vs speculative decoding on the bundled model, side by side."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from importlib import resources

from draftgate.cli.common import add_engine_args, engine_config
from draftgate.engine import DrafterKind, build_engine
from draftgate.engine.config import EngineConfig
from draftgate.models.loader import load_model
from draftgate.types import SamplingParams

__all__ = ["register", "run", "builtin_prompts"]


def builtin_prompts() -> list[dict]:  # type: ignore[type-arg]
    text = resources.files("draftgate.data").joinpath("prompts.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("demo", help="plain vs speculative decoding on built-in prompts", description=__doc__)
    add_engine_args(p, default_drafter="auto")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--runs",
        type=int,
        default=3,
        help="runs per prompt, plain and speculative alternating which goes first; the speedup shown is "
        "the median of the runs' ratios [min-max] (default: %(default)s; one run on a shared machine "
        "can be off by 20%%)",
    )
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    spec_cfg = engine_config(a)
    if a.runs < 1:
        print("draftgate: error: --runs must be >= 1", file=sys.stderr)
        return 2
    if spec_cfg.drafter == DrafterKind.NONE:
        print("draftgate: error: the demo compares against plain decoding; pick a drafter", file=sys.stderr)
        return 2
    print(f"loading {spec_cfg.model} ...", file=sys.stderr)
    loaded = load_model(
        spec_cfg.model, dtype=spec_cfg.torch_dtype, cache_dir=spec_cfg.cache_dir, quantized=spec_cfg.quantized
    )
    plain_cfg = EngineConfig(**{**spec_cfg.__dict__, "drafter": DrafterKind.NONE, "k": 0})
    arms = {"plain": build_engine(plain_cfg, loaded), "spec": build_engine(spec_cfg, loaded)}
    params = SamplingParams(max_new_tokens=a.max_new_tokens)
    rows = []
    try:
        prompts = builtin_prompts()
        for i, pr in enumerate(prompts):
            prompt = pr["turns"][0]
            times: dict[str, list[float]] = {"plain": [], "spec": []}
            outs = {}
            same = True
            for r in range(a.runs):
                # Each run from the same drafter memory (the suffix trie keeps finished answers: a
                # repeated prompt would be drafted from the last run's), the arms alternating first.
                arms["spec"].forget_finished()
                for name in ("plain", "spec") if r % 2 == 0 else ("spec", "plain"):
                    c = arms[name].complete(prompt, params)
                    times[name].append(c.completion_tokens / c.elapsed_s)
                    outs[name] = c
                same &= outs["spec"].token_ids == outs["plain"].token_ids
            ratios = [ts / tp for tp, ts in zip(times["plain"], times["spec"], strict=True)]  # paired by run
            st = outs["spec"].stats
            rows.append(
                (
                    pr["category"],
                    statistics.median(times["plain"]),
                    statistics.median(times["spec"]),
                    (statistics.median(ratios), min(ratios), max(ratios)),
                    st.acceptance_rate,
                    st.mean_accepted_length,
                    same,
                )
            )
            print(f"  [{i + 1}/{len(prompts)}] {pr['category']}: {_speedup(rows[-1][3])}", file=sys.stderr)
    finally:
        for e in arms.values():
            e.shutdown()
    _print_table(rows, spec_cfg)
    return 0 if all(r[-1] for r in rows) else 1


def _print_table(rows: list[tuple], cfg: EngineConfig) -> None:  # type: ignore[type-arg]
    k = "auto" if cfg.k is None else str(cfg.k)
    print(
        f"\nDraftGate demo: {cfg.model}, drafter={cfg.drafter.value}, K={k}, greedy, {cfg.device}, --dtype {cfg.dtype}"
    )
    print("tok/s: medians over the runs; speedup: the median of each run's spec/plain ratio [min-max]")
    head = ("prompt", "plain tok/s", "spec tok/s", "speedup", "acceptance", "mean acc. len", "identical")
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" for _ in head) + "|")
    for cat, tp, ts, sp, acc, mal, same in rows:
        print(f"| {cat} | {tp:.1f} | {ts:.1f} | {_speedup(sp)} | {acc:.2f} | {mal:.2f} | {'yes' if same else 'NO'} |")


def _speedup(sp: tuple[float, float, float]) -> str:
    """Median of the runs' ratios, with their range when there were several runs."""
    med, lo, hi = sp
    return f"{med:.2f}x" if lo == hi else f"{med:.2f}x [{lo:.2f}-{hi:.2f}]"
