"""`draftgate bench` and `draftgate sweep-k`: side-by-side benchmarks and a K sweep.

Thin: parse arguments, build configs, call ``draftgate.bench``, print a summary.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from draftgate.bench import (
    BenchConfig,
    build_arms,
    build_report,
    load_prompts,
    parse_arms,
    recommend,
    run_bench,
    sweep_arms,
    write_report,
)
from draftgate.bench.arms import Arm, ArmSpec
from draftgate.bench.prompts import BenchPrompt, builtin_prompts_path
from draftgate.bench.report import doc_summary, summary_table
from draftgate.bench.runner import BenchResult
from draftgate.bench.sweep import format_recommendations
from draftgate.cli.common import add_engine_args, add_sampling_args, engine_config
from draftgate.engine import EngineConfig
from draftgate.models.loader import load_model
from draftgate.types import SamplingParams

__all__ = ["register", "run_bench_cmd", "run_sweep_cmd"]

ARM_HELP = (
    "comma-separated arms: plain, ngram, suffix, auto, model, quant, eagle (each optionally :k=N or :k=auto; "
    "eagle and auto also :head=DIR), hf, hf-lookup[:k=N], llamacpp (llama.cpp's llama-server, built by "
    "`make llamacpp`), openai+http://HOST:PORT[/v1][?model=NAME] (default: %(default)s)"
)

BENCH_DESCRIPTION = (
    "Run arms side by side on the same prompts (interleaved window by window, one warm-up request "
    "per arm excluded) and report tokens/s, TTFT, ITL p50/p90/p99, end-to-end latency, acceptance, "
    "mean accepted length and the ratio to the baseline arm per category and load level, plus a "
    "greedy lossless check. Writes report.json, report.md, requests.jsonl and PNG plots to --out."
)
SWEEP_DESCRIPTION = (
    "Benchmark plain decoding against each drafter at each K (and adaptive K), per category, and "
    "print the recommended per-route configuration: drafter, K or auto, enabled or not, with the "
    "expected speedup. Writes sweep.json next to the full benchmark report in --out."
)


def _ints(v: str) -> tuple[int, ...]:
    try:
        xs = tuple(int(x) for x in v.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {v!r}") from None
    if not xs or any(x < 1 for x in xs):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {v!r}")
    return xs


def _names(v: str) -> list[str]:
    return [x.strip() for x in v.split(",") if x.strip()]


def _add_common(p: argparse.ArgumentParser, out: str, runs: int, section: str) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--prompts", type=Path, default=None, help="JSONL prompt file (default: the built-in prompts)")
    g.add_argument("--categories", type=_names, default=None, help="only these categories (comma-separated)")
    g.add_argument("--limit", type=int, default=None, help="at most N prompts in all (after --categories)")
    g.add_argument("--per-category", type=int, default=None, help="at most N prompts per category")
    g.add_argument("--concurrency", type=_ints, default=(1,), help="load levels, e.g. 1,4,16 (default: 1)")
    g.add_argument("--rate", type=float, default=None, help="Poisson arrivals per second instead of --concurrency")
    g.add_argument("--window", type=int, default=None, help="prompts per interleaving window (default: concurrency)")
    g.add_argument("--runs", type=int, default=runs, help="repetitions; ratios are min/median/max over runs")
    g.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    g.add_argument("--no-warmup", action="store_true", help="skip the warm-up request per arm")
    g.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    g.add_argument("--out", type=Path, default=Path(out), help="output folder (default: %(default)s)")
    g.add_argument("--update-doc", type=Path, default=None, metavar="MD", help="also splice report.md into this page")
    g.add_argument(
        "--doc-section", default=section, help="marker name of the section to replace (default: %(default)s)"
    )
    add_sampling_args(p, max_new_tokens=128)
    add_engine_args(p, default_drafter="none")
    for action in p._actions:  # arms choose the drafter and K
        if action.dest in ("drafter", "k"):
            action.help = argparse.SUPPRESS


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "bench", help="benchmark arms side by side (throughput, TTFT, ITL, acceptance)", description=BENCH_DESCRIPTION
    )
    p.add_argument("--arms", default="plain,ngram,suffix,auto", help=ARM_HELP)
    p.add_argument("--baseline", default="plain", help="the arm ratios are taken against (default: %(default)s)")
    _add_common(p, out="bench-out", runs=3, section="engine")
    p.set_defaults(func=run_bench_cmd)

    s = sub.add_parser(
        "sweep-k", help="sweep drafters and K per category; recommend a route config", description=SWEEP_DESCRIPTION
    )
    s.add_argument(
        "--drafters", type=_names, default=["ngram", "suffix"], help="engine drafters (default: ngram,suffix)"
    )
    s.add_argument("--ks", type=_ints, default=(1, 2, 4, 8), help="fixed K values (default: 1,2,4,8)")
    s.add_argument("--no-auto", action="store_true", help="do not include each drafter's adaptive K")
    s.add_argument("--min-speedup", type=float, default=1.05, help="enable speculation above this (default: 1.05)")
    _add_common(s, out="sweep-out", runs=2, section="sweep")
    s.set_defaults(func=run_sweep_cmd)


def _bench_config(a: argparse.Namespace, specs: tuple[ArmSpec, ...], baseline: str) -> BenchConfig:
    if baseline not in {s.name for s in specs}:
        raise ValueError(f"--baseline {baseline!r} must be one of the arms {[s.name for s in specs]}")
    params = SamplingParams(
        a.temperature, a.top_k, a.top_p, a.seed, a.max_new_tokens, tuple(a.stop), ignore_eos=a.ignore_eos
    )
    return BenchConfig(params.validate(), baseline, a.concurrency, a.rate, a.runs, a.window, not a.no_warmup).validate()


def _run_with_progress(arms: dict[str, Arm], prompts: list[BenchPrompt], cfg: BenchConfig) -> BenchResult:
    """run_bench with a tqdm bar on stderr; the arms are closed whatever happens."""
    from tqdm import tqdm

    try:
        with tqdm(total=1, file=sys.stderr, unit="step", dynamic_ncols=True, mininterval=0.5) as bar:

            def progress(done: int, total: int, desc: str) -> None:
                bar.total = total
                bar.set_description(desc, refresh=False)
                bar.update(done - bar.n)

            return run_bench(arms, prompts, cfg, progress)
    finally:
        for arm in arms.values():
            arm.close()


def _meta(ecfg: EngineConfig, path: Path, n_prompts: int, argv: list[str]) -> dict[str, Any]:
    return {
        "model": ecfg.model,
        "device": ecfg.device,
        "dtype": ecfg.dtype,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": f"{platform.machine()} {platform.processor()}".strip(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "prompts": _shown_path(path),
        "prompts_count": n_prompts,
        "command": "draftgate " + " ".join(argv),
        "cpu": _cpu(),
        "commit": _commit(),
    }


def _shown_path(path: Path) -> str:
    """The prompt file as a reader can find it: relative to the working folder, the package's own by name."""
    if path.resolve() == Path(builtin_prompts_path()).resolve():
        return "built-in: draftgate/data/prompts.jsonl"
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _cpu() -> str:
    """The CPU model, family and model numbers, and the kernel level used (benchmarks depend on all)."""
    from draftgate.models.native.build import cpu_level

    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or platform.machine()
    name = info.get("model name", platform.machine())
    family, model = info.get("cpu family", "?"), info.get("model", "?")
    return f"{name} (family {family} model {model}, {cpu_level()}), {os.cpu_count()} CPUs"


def _commit() -> str | None:
    """The checkout's commit (``+changes`` when tracked files differ from it); None outside a git checkout."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+changes" if dirty else "")


def _update_doc(a: argparse.Namespace, markdown: str) -> None:
    """--update-doc: splice ``markdown`` (and the plots in --out) into the page's marked section."""
    if a.update_doc is None:
        return
    from draftgate.bench.docs import update_doc

    update_doc(a.update_doc, a.doc_section, markdown, sorted(a.out.glob("*.png")))
    print(f"updated section {a.doc_section!r} of {a.update_doc}", file=sys.stderr)


def _execute(a: argparse.Namespace, specs: tuple[ArmSpec, ...], baseline: str) -> tuple[dict[str, Any], int]:
    """1. prompts and configs, 2. the model once and the arms, 3. the run, 4. the report; returns failures."""
    path = a.prompts or builtin_prompts_path()
    prompts = load_prompts(path, a.categories, a.limit, a.per_category)
    cfg = _bench_config(a, specs, baseline)
    ecfg = engine_config(a)
    ecfg = replace(ecfg, max_batch=max(ecfg.max_batch, *a.concurrency))

    print(f"loading {ecfg.model} ...", file=sys.stderr)
    loaded = load_model(ecfg.model, dtype=ecfg.torch_dtype, cache_dir=ecfg.cache_dir, quantized=ecfg.quantized)
    result = _run_with_progress(build_arms(specs, ecfg, loaded), prompts, cfg)

    report = build_report(result, cfg, _meta(ecfg, path, len(prompts), a.argv))
    files = write_report(report, result, a.out, plots=not a.no_plots)
    print(f"wrote {', '.join(str(f) for f in files)}", file=sys.stderr)

    for e in report["errors"][:3]:
        print(f"draftgate: request failed: {e}", file=sys.stderr)
    engine_arms = {s.name for s in specs if s.drafter is not None}
    lossy = sum(e["mismatches"] for n, e in report["lossless"]["arms"].items() if n in engine_arms)
    if lossy:
        print(f"draftgate: LOSSLESS CHECK FAILED: {lossy} outputs differ from {baseline}", file=sys.stderr)
    return report, lossy + sum(r["errors"] for r in report["results"] if r["category"] == "all")


def run_bench_cmd(a: argparse.Namespace) -> int:
    report, failures = _execute(a, parse_arms(a.arms), a.baseline)
    _update_doc(a, doc_summary(report))
    print(summary_table(report))
    print(f"\nfull report: {a.out / 'report.md'}")
    return 1 if failures else 0


def run_sweep_cmd(a: argparse.Namespace) -> int:
    specs = sweep_arms(a.drafters, a.ks, include_auto=not a.no_auto)
    report, failures = _execute(a, specs, "plain")
    recs = recommend(report, min_speedup=a.min_speedup)
    (a.out / "sweep.json").write_text(
        json.dumps({"min_speedup": a.min_speedup, "recommendations": recs}, indent=2) + "\n"
    )
    table = format_recommendations(recs)
    _update_doc(a, f"{doc_summary(report)}\n\nRecommended configuration per category:\n\n{table}")
    print(table)
    routes = {
        r["category"]: {"enabled": r["enable"], "drafter": r["drafter"], "k": r["k"]}
        for r in recs
        if r["load"] == report["meta"]["loads"][0]
    }
    print(f"\nper-route configuration ({report['meta']['loads'][0]}):\n{json.dumps(routes, indent=2)}")
    print(f"\nwrote {a.out / 'sweep.json'} and the full report in {a.out}")
    return 1 if failures else 0
