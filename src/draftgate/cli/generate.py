"""`draftgate generate`: one prompt, streamed to the terminal (or one JSON object)."""

from __future__ import annotations

import argparse
import json
import sys

from draftgate.cli.common import add_engine_args, add_sampling_args, engine_config, sampling_params
from draftgate.engine import Chunk, build_engine

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("generate", help="generate text for one prompt", description=__doc__)
    p.add_argument("prompt", help="the user message (chat template applied unless --raw)")
    p.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    add_engine_args(p)
    add_sampling_args(p)
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    cfg = engine_config(a)
    params = sampling_params(a)
    engine = build_engine(cfg)
    try:

        def stream(c: Chunk) -> None:
            if not a.json and c.text:
                sys.stdout.write(c.text)
                sys.stdout.flush()

        res = engine.complete(a.prompt, params, raw=a.raw, on_chunk=stream)
    finally:
        engine.shutdown()
    if a.json:
        print(
            json.dumps(
                {
                    "text": res.text,
                    "token_ids": res.token_ids,
                    "prompt_tokens": res.prompt_tokens,
                    "completion_tokens": res.completion_tokens,
                    "finish_reason": res.finish_reason,
                    "elapsed_s": round(res.elapsed_s, 4),
                    "tokens_per_s": round(res.completion_tokens / res.elapsed_s, 3) if res.elapsed_s else 0.0,
                    "spec": res.stats.to_json(),
                }
            )
        )
    else:
        sys.stdout.write("\n")
        s = res.stats
        print(
            f"[{res.completion_tokens} tokens, {res.completion_tokens / res.elapsed_s:.1f} tok/s, "
            f"drafter {s.drafter}, acceptance {s.acceptance_rate:.2f}, mean accepted length "
            f"{s.mean_accepted_length:.2f}]",
            file=sys.stderr,
        )
    return 0
