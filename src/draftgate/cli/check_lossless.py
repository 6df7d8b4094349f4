"""`draftgate check-lossless`: run the lossless guarantee against a model + drafter or a route.

Thin: build the route's back end the way `serve` does, turn prompts into ids, call
``draftgate.bench.check_lossless``, print the report, exit 0 (passed) or 1 (a difference).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from draftgate.bench.check_lossless import CheckConfig, CheckPrompt, check_lossless, planned_requests, render
from draftgate.bench.prompts import builtin_prompts_path, load_prompts
from draftgate.cli.serve import add_route_args, route_specs

__all__ = ["register", "run_check_lossless"]

_HELP = """\
Check that speculative decoding on a back end is lossless, against that back end's own plain
decoding (the same target, no drafts):

  greedy        speculative tokens bit-identical to plain greedy tokens, per prompt;
  seeded        the same seeded sampled request twice gives the same tokens; when every
                draft was deterministic (n-gram, suffix, greedy model...), the tokens equal
                plain sampling with the same seed;
  distribution  --samples seeded requests per arm, --sample-tokens tokens each, and a
                chi-square test (speculative vs plain, per output position) at --alpha.

The back end is a model and drafter (--model, --drafter, --k, --draft-model; a remote drafter
or --target grpc://... / openai+http://... / vllm+http://... as in `draftgate serve`) or one route of a routes
file (--routes FILE --route NAME). Exit status: 0 lossless, 1 a check failed (the report
names the first difference), 2 bad input."""

_EPILOG = textwrap.dedent("""\
    examples:
      draftgate check-lossless --drafter ngram --k 4
      draftgate check-lossless --drafter http://127.0.0.1:8101 --target grpc://127.0.0.1:8100
      draftgate check-lossless --routes routes.yaml --route smollm2 --prompts my.jsonl --json""")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "check-lossless",
        help="check that speculation changes no output token",
        description=_HELP,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_route_args(p)
    g = p.add_argument_group("route file")
    g.add_argument("--routes", type=Path, default=None, metavar="FILE", help="routes file (.yaml/.yml/.toml)")
    g.add_argument("--route", default=None, metavar="NAME", help="the route to check (needed when FILE has several)")
    w = p.add_argument_group("workload")
    w.add_argument(
        "--prompts", type=Path, default=None, help="JSONL with prompt, messages or turns (default: built-in)"
    )
    w.add_argument("--limit", type=int, default=8, help="at most N prompts (default: %(default)s)")
    w.add_argument("--per-category", type=int, default=None, help="at most N prompts per category (before --limit)")
    w.add_argument(
        "--max-new-tokens", type=int, default=48, help="tokens per greedy/seeded request (default: %(default)s)"
    )
    w.add_argument("--seeds", type=_seeds, default=(1, 2), help="seeds per prompt, comma-separated (default: 1,2)")
    w.add_argument("--temperature", type=float, default=0.8, help="for the sampling checks (default: %(default)s)")
    w.add_argument("--top-k", type=int, default=0, help="for the sampling checks (default: off)")
    w.add_argument("--top-p", type=float, default=0.95, help="for the sampling checks (default: %(default)s)")
    w.add_argument(
        "--samples",
        type=int,
        default=300,
        help="requests per arm in the distribution test; 0 skips it (default: %(default)s)",
    )
    w.add_argument(
        "--sample-tokens", type=int, default=4, help="tokens per distribution request (default: %(default)s)"
    )
    w.add_argument("--alpha", type=float, default=1e-3, help="significance level of that test (default: %(default)s)")
    w.add_argument("--greedy-only", action="store_true", help="skip the sampling checks")
    w.add_argument("--ignore-eos", action="store_true", help="greedy and seeded requests run to --max-new-tokens")
    w.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=run_check_lossless, served_model_name=None)


def _seeds(v: str) -> tuple[int, ...]:
    try:
        xs = tuple(int(x) for x in v.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds must be comma-separated integers, got {v!r}") from None
    if not xs:
        raise argparse.ArgumentTypeError("--seeds needs at least one seed")
    return xs


def _pick(specs: list, name: str | None):  # -> RouteSpec
    names = [s.name for s in specs]
    if name is None:
        if len(specs) > 1:
            raise ValueError(
                f"the routes file has {len(specs)} routes; pick one with --route NAME ({', '.join(names)})"
            )
        return specs[0]
    for s in specs:
        if s.name == name:
            return s
    raise ValueError(f"no route named {name!r}; the routes are: {', '.join(names)}")


def run_check_lossless(a: argparse.Namespace) -> int:
    from tqdm import tqdm

    from draftgate.server.routes_file import build_route_table

    if a.route is not None and a.routes is None:
        raise ValueError("--route needs --routes FILE")
    if a.limit is not None and a.limit < 1:
        raise ValueError("--limit must be >= 1")
    cfg = CheckConfig(
        max_new_tokens=a.max_new_tokens,
        seeds=a.seeds,
        temperature=a.temperature,
        top_k=a.top_k,
        top_p=a.top_p,
        samples=a.samples,
        sample_tokens=a.sample_tokens,
        alpha=a.alpha,
        sampling=not a.greedy_only,
        ignore_eos=a.ignore_eos,
    ).validate()
    spec = _pick(route_specs(a), a.route)
    prompts = load_prompts(a.prompts or builtin_prompts_path(), limit=a.limit, per_category=a.per_category)
    print(f"draftgate: loading route {spec.name!r}", file=sys.stderr)
    routes = build_route_table([spec])
    try:
        backend = next(iter(routes)).engine
        cases = [CheckPrompt(p.id, backend.encode(p.messages(0, []))) for p in prompts]
        k = "auto" if spec.config.k is None else spec.config.k
        what = f"route {spec.name} (target {spec.target.kind.value}, drafter {spec.drafter_spec.text}, k {k})"
        with tqdm(
            total=planned_requests(len(cases), cfg), desc="check-lossless", unit="req", file=sys.stderr, disable=None
        ) as bar:
            report = check_lossless(backend, what, cases, cfg, progress=lambda _check: bar.update())
    finally:
        routes.close()
    print(json.dumps(report.to_json(), indent=2) if a.json else render(report))
    return 0 if report.passed else 1
