"""`draftgate check-pair` and `draftgate plan-memory`: pre-flight checks for a target + draft pair."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import get_args

from draftgate.cli.common import default_cache_dir
from draftgate.errors import BadRequestError
from draftgate.modelinfo.memory_plan import (
    DEFAULT_RESERVE_FRACTION,
    DRAFT_SHARE_LIMIT,
    GIB,
    KvDtype,
    MemoryPlan,
    WeightDtype,
)

__all__ = ["register", "run_check_pair", "run_plan_memory"]

_PAIR_HELP = """\
Check that DRAFT can serve as a draft model for TARGET: same vocabulary (every id
means the same text), same logit width, same bos id, overlapping end-of-sequence ids
(errors); chat templates that render the same ids and a draft context at least the
target's (warnings). Exit status: 0 compatible (warnings allowed), 2 not compatible.
The same check refuses a mismatched --draft-model in `generate`, `serve` and routes."""

_PLAN_HELP = f"""\
Without --gpu-memory: this machine's memory for DraftGate's own engine. A GGUF target (or a known
name) counts its weights as the native kernels pack them from the file; others at float32 (twice:
the tensors and the packed copy). Each model has a float32 KV cache of --kv-blocks x 16 tokens, plus
0.5 GiB for the process, against --memory (default: the memory available now). The engine runs the
same check before it loads anything.

With --gpu-memory: plan GPU memory for a target + draft pair (the seeds' envelope):
  budget = target weights + draft weights + KV cache of both + system reserve.
KV per token per model = 2 * layers * kv_heads * head_dim * bytes. The reserve
(activations, CUDA context) defaults to {DEFAULT_RESERVE_FRACTION:.0%} of --gpu-memory. Warns when the
draft (weights + its KV) takes more than {DRAFT_SHARE_LIMIT:.0%} of the budget.
Exit status: 0 fits, 2 bad input or does not fit (weights, one sequence, or --max-seqs)."""

_PLAN_EPILOG = """\
{config}
examples:
  draftgate plan-memory --target gemma3-270m
  draftgate plan-memory --target llama-3-70b --draft llama-3.2-1b --gpu-memory 192 --max-seqs 16"""


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from draftgate.modelinfo.shapes import NAMED_SHAPES

    raw = argparse.RawDescriptionHelpFormatter
    config_help = (
        f"CONFIG: a named shape ({', '.join(NAMED_SHAPES)}), an HF config.json or a folder "
        "holding one, or a .gguf file (metadata only)."
    )
    p = sub.add_parser(
        "check-pair", help="check that a draft model fits a target", description=_PAIR_HELP, formatter_class=raw
    )
    p.add_argument("target", help="target model: smollm2-135m (bundled), gemma3-270m, a .gguf file or an HF folder")
    p.add_argument("draft", help="draft model: same forms as TARGET")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where parsed GGUF weights are cached (default: ~/.cache/draftgate)",
    )
    p.set_defaults(func=run_check_pair)

    p = sub.add_parser(
        "plan-memory",
        help="GPU memory plan: weights, KV cache, how many sequences fit",
        description=_PLAN_HELP,
        epilog=_PLAN_EPILOG.format(config=textwrap.fill(config_help, width=88)),
        formatter_class=raw,
    )
    p.add_argument("--target", required=True, metavar="CONFIG", help="the target's shape (see below)")
    p.add_argument(
        "--draft", metavar="CONFIG", default=None, help="the draft's shape (omit for n-gram/suffix drafting)"
    )
    p.add_argument("--gpu-memory", type=float, default=None, metavar="GiB", help="plan a GPU of this many GiB")
    p.add_argument(
        "--memory", type=float, default=None, metavar="GiB", help="this machine (default: the memory available)"
    )
    p.add_argument(
        "--kv-blocks", type=int, default=1024, metavar="N", help="this machine: KV blocks of 16 tokens (default: 1024)"
    )
    p.add_argument("--dtype", default="bf16", choices=get_args(WeightDtype), help="weight dtype (default: %(default)s)")
    p.add_argument(
        "--kv-dtype",
        default=None,
        choices=get_args(KvDtype),
        help="KV cache dtype (default: the weight dtype; bf16 for int8/int4 weights)",
    )
    p.add_argument("--context", type=int, default=4096, metavar="N", help="tokens per sequence (default: %(default)s)")
    p.add_argument("--max-seqs", type=int, default=None, metavar="N", help="concurrent sequences to check")
    p.add_argument(
        "--reserve",
        type=float,
        default=None,
        metavar="GiB",
        help=f"system reserve in GiB (default: {DEFAULT_RESERVE_FRACTION:.0%}% of --gpu-memory)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.set_defaults(func=run_plan_memory)


# ------------------------------------------------------------------ check-pair


def run_check_pair(a: argparse.Namespace) -> int:
    from draftgate.modelinfo.pairing import check_pair
    from draftgate.models.loader import load_model_info

    cache = a.cache_dir or default_cache_dir()
    target = load_model_info(a.target, cache_dir=cache)  # config, tokenizer, subset ids: no weights
    draft = load_model_info(a.draft, cache_dir=cache)
    report = check_pair(target, draft, a.target, a.draft)
    if a.json:
        print(json.dumps(report.to_json()))
    else:
        print(f"target: {a.target}\ndraft:  {a.draft}")
        for f in report.findings:
            print(f"  {f.severity:<7} {f.check}: {f.reason}")
        print("compatible" if report.ok else "NOT compatible")
    if not report.ok:
        reasons = "; ".join(f"{f.check}: {f.reason}" for f in report.errors)
        print(f"draftgate: error: {a.draft} cannot draft for {a.target}: {reasons}", file=sys.stderr)
        return 2
    return 0


# ----------------------------------------------------------------- plan-memory


def run_plan_memory(a: argparse.Namespace) -> int:
    from draftgate.modelinfo.memory_plan import plan_memory
    from draftgate.modelinfo.shapes import resolve_shape

    if a.gpu_memory is None:
        return _host_plan(a)
    target = resolve_shape(a.target)
    draft = resolve_shape(a.draft) if a.draft else None
    plan = plan_memory(
        target,
        draft,
        a.gpu_memory,
        dtype=a.dtype,
        kv_dtype=a.kv_dtype,
        context=a.context,
        max_seqs=a.max_seqs,
        reserve_gib=a.reserve,
    )
    problem = plan.weights_problem()
    if problem:
        raise BadRequestError(problem)
    if a.json:
        print(json.dumps({"target_config": a.target, "draft_config": a.draft, **plan.to_json()}))
    else:
        print(_format_plan(plan, a.target, a.draft))
    if plan.seqs_fit == 0 or plan.max_seqs_fit is False:
        print(f"draftgate: error: {_shortfall(plan)}", file=sys.stderr)
        return 2
    return 0


def _format_plan(plan: MemoryPlan, target: str, draft: str | None) -> str:
    def row(label: str, n: int) -> str:
        return f"  {label:<44} {n / GIB:>9.2f} {n / plan.budget_bytes:>7.1%}"

    N, C = plan.planned_seqs, plan.context
    lines = [
        f"memory plan: {target}" + (f" + draft {draft}" if draft else " (no draft model)"),
        f"  {plan.dtype} weights, {plan.kv_dtype} KV cache, {C} tokens per sequence",
        f"  {'':<44} {'GiB':>9} {'budget':>7}",
        row(f"target weights ({_params(plan.target.params)} params)", plan.target.weight_bytes),
    ]
    if plan.draft is not None:
        lines.append(row(f"draft weights ({_params(plan.draft.params)} params)", plan.draft.weight_bytes))
    kv_t = plan.target.kv_bytes_per_token
    lines.append(row(f"target KV: {N} seqs x {C} x {kv_t:,} B/token", plan.kv_bytes("target")))
    if plan.draft is not None:
        kv_d = plan.draft.kv_bytes_per_token
        lines.append(row(f"draft KV:  {N} seqs x {C} x {kv_d:,} B/token", plan.kv_bytes("draft")))
    lines.append(row("system reserve (activations, CUDA context)", plan.reserve_bytes))
    used = plan.weight_bytes + plan.kv_bytes("target") + plan.kv_bytes("draft") + plan.reserve_bytes
    lines += [row("total", used), row("GPU memory budget", plan.budget_bytes)]
    lines.append(
        f"fits {plan.seqs_fit} concurrent sequences of {C} tokens ({plan.kv_bytes_per_seq / GIB:.2f} GiB KV each)"
    )
    if plan.max_seqs is not None:
        lines.append(f"--max-seqs {plan.max_seqs}: " + ("fits" if plan.max_seqs_fit else "does NOT fit"))
    if plan.draft is not None:
        lines.append(f"draft share: {plan.draft_share:.1%} of the budget (weights + its KV for {N} sequences)")
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)


def _params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _shortfall(plan: MemoryPlan) -> str:
    free = plan.free_for_kv_bytes / GIB
    want = plan.max_seqs or 1
    need = want * plan.kv_bytes_per_seq / GIB
    return (
        f"{want} sequence(s) of {plan.context} tokens need {need:.2f} GiB of KV cache, {free:.2f} GiB is left "
        f"after weights and reserve (fits {plan.seqs_fit}); lower --max-seqs or --context, "
        "use a smaller --dtype/--kv-dtype, or more memory"
    )


def _host_plan(a: argparse.Namespace) -> int:
    """This machine: the engine's own check (modelinfo.host_memory), printed."""
    from draftgate.modelinfo.host_memory import PROCESS_BYTES, available_bytes, host_need
    from draftgate.modelinfo.shapes import NAMED_SHAPES, resolve_shape
    from draftgate.models.known import KNOWN_MODELS
    from draftgate.models.loader import resolve_model_path

    if a.kv_blocks < 1:
        raise BadRequestError(f"--kv-blocks must be >= 1, got {a.kv_blocks}")
    needs = []
    for role, name in [("target", a.target)] + ([("draft", a.draft)] if a.draft else []):
        shape_only = name not in KNOWN_MODELS and name.strip().lower() in NAMED_SHAPES  # no file: float weights
        path = Path(name) if shape_only else resolve_model_path(name)
        cfg = resolve_shape(name if shape_only else str(path))
        needs.append(host_need(f"{role} {name}", path, cfg, "auto", a.kv_blocks * 16))
    limit = int(a.memory * GIB) if a.memory is not None else available_bytes()
    total = sum(n.total for n in needs) + PROCESS_BYTES
    fits = limit is None or total <= limit
    if a.json:
        rows = {n.name: {"weights_gib": n.weights / GIB, "kv_gib": n.kv / GIB} for n in needs}
        out = {"models": rows, "process_gib": PROCESS_BYTES / GIB, "total_gib": total / GIB}
        print(json.dumps({**out, "limit_gib": None if limit is None else limit / GIB, "fits": fits}))
    else:
        print(f"memory plan on this machine ({a.kv_blocks} KV blocks of 16 tokens per model, float32 KV)")
        for n in needs:
            print(f"  {n.name:<40} weights {n.weights / GIB:7.2f} GiB   KV {n.kv / GIB:7.2f} GiB")
        print(f"  {'process (Python, PyTorch, buffers)':<40} {PROCESS_BYTES / GIB:15.2f} GiB")
        where = "--memory" if a.memory is not None else "available now"
        have = "unknown" if limit is None else f"{limit / GIB:.2f} GiB {where}"
        print(f"  total {total / GIB:.2f} GiB of {have}: " + ("fits" if fits else "does NOT fit"))
    if not fits:
        print(
            f"draftgate: error: these models need {total / GIB:.2f} GiB; use a smaller or more quantized model "
            "or fewer --kv-blocks",
            file=sys.stderr,
        )
        return 2
    return 0
