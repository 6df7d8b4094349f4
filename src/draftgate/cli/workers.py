"""`draftgate serve-target` and `draftgate serve-draft`: the worker processes of a split deployment.

serve-target holds the target model and each generation session's KV cache, and
verifies the drafts a gateway sends (gRPC, proto/draftgate/v1/target.proto).
serve-draft proposes draft tokens with a small model (or n-gram lookup) over
HTTP (POST /v1/propose). A gateway uses them with
`draftgate serve --target grpc://HOST:PORT[,grpc://...] --drafter http://HOST:PORT`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch

from draftgate.cli.common import port_arg

__all__ = ["register", "run_target", "run_draft"]

TARGET_DESCRIPTION = """\
Run a gRPC target worker: it loads the target model, keeps each generation
session's KV cache, verifies the drafts a gateway sends with the engine's exact
verifier, and batches all sessions' rounds into one forward. It also answers
Score (log-probs of a token suffix) and Health.

example:
  draftgate serve-target --model smollm2-135m --port 50051 --kv-blocks 2048
  draftgate serve --target grpc://127.0.0.1:50051,grpc://10.0.0.2:50051
"""

DRAFT_DESCRIPTION = """\
Run an HTTP draft worker: POST /v1/propose {tokens, num_tokens, temperature,
top_k, top_p, seed[, session_id, offset]} returns {tokens, logprobs, q}, where
each q row is the sparse distribution (top --q-top-n ids, renormalized) the
token was drawn from, so verification stays exact. DELETE /v1/sessions/{id}
drops a session. The draft model must share the target's tokenizer.

example:
  draftgate serve-draft --model path/to/small-llama --port 8100
  draftgate serve-draft --drafter ngram --port 8100      (no model needed)
  draftgate serve --drafter http://127.0.0.1:8100 --target grpc://127.0.0.1:50051
"""


def _positive(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {v!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def _model_args(p: argparse.ArgumentParser, model_default: str | None, kv_blocks: int) -> None:
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        default=model_default,
        help="smollm2-135m (bundled), gemma3-270m (installed on first use), a .gguf file or an HF folder"
        + (" (default: %(default)s)" if model_default else ""),
    )
    g.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    g.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weights: auto runs a GGUF model's own quantization (Q4_0/Q4_1/Q8_0/Q4_K/Q6_K) on the native "
        "kernels, float32 for HF folders; float32/bfloat16/float16 dequantize (default: %(default)s)",
    )
    g.add_argument("--threads", type=_positive, default=None, help="CPU threads for the forward (default: all cores)")
    g.add_argument(
        "--kernels",
        default="auto",
        choices=["auto", "native", "torch"],
        help="forward implementation (see `draftgate generate --help`) (default: %(default)s)",
    )
    g.add_argument("--kv-blocks", type=_positive, default=kv_blocks, help="KV cache blocks (default: %(default)s)")
    g.add_argument("--block-size", type=_positive, default=16, help="tokens per KV block (default: %(default)s)")
    g.add_argument("--cache-dir", type=Path, default=None, help="where dequantized GGUF weights are cached")


def _server_args(p: argparse.ArgumentParser, port: int) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    g.add_argument("--port", type=port_arg, default=port, help="port (default: %(default)s)")
    g.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    t = sub.add_parser(
        "serve-target",
        help="run a gRPC target worker (holds sessions' KV, verifies drafts)",
        description=TARGET_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _model_args(t, "smollm2-135m", 1024)
    _server_args(t, 50051)
    t.add_argument(
        "--max-batch", type=_positive, default=64, help="most sessions' rounds in one forward (default: %(default)s)"
    )
    t.set_defaults(func=run_target)

    d = sub.add_parser(
        "serve-draft",
        help="run an HTTP draft worker (POST /v1/propose)",
        description=DRAFT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _model_args(d, None, 512)
    _server_args(d, 8100)
    d.add_argument(
        "--drafter",
        default="model",
        choices=["model", "ngram"],
        help="model: the --model draft model; ngram: prompt lookup, no model (default: %(default)s)",
    )
    d.add_argument("--q-top-n", type=_positive, default=64, help="ids kept in each sparse q row (default: %(default)s)")
    d.add_argument("--max-sessions", type=_positive, default=1024, help="sessions kept, least recently used evicted")
    d.set_defaults(func=run_draft)


def _setup(a: argparse.Namespace) -> None:
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    logging.basicConfig(level=a.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")


def _runner(a: argparse.Namespace):  # -> ModelRunner
    from draftgate.engine.config import DrafterKind, EngineConfig
    from draftgate.engine.factory import build_runner
    from draftgate.models.runner import Kernels
    from draftgate.paths import default_cache_dir

    cfg = EngineConfig(
        model=a.model,
        drafter=DrafterKind.NONE,
        device=a.device,
        dtype=a.dtype,
        num_blocks=a.kv_blocks,
        block_size=a.block_size,
        cache_dir=a.cache_dir or default_cache_dir(),
        kernels=Kernels(a.kernels),
    )
    return build_runner(cfg.validate())


def run_target(a: argparse.Namespace) -> int:
    from draftgate.engine.session_host import SessionHost
    from draftgate.server.workers.target_server import TargetWorkerServer

    _setup(a)
    runner = _runner(a)
    server = TargetWorkerServer(SessionHost(runner, a.model, max_batch=a.max_batch), f"{a.host}:{a.port}")
    try:
        server.start()
    except OSError as e:
        raise ValueError(f"cannot serve on {a.host}:{a.port}: {e}") from None
    print(f"draftgate: target worker for {a.model} on grpc://{server.target}", file=sys.stderr)
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop(grace=2.0)
    return 0


def run_draft(a: argparse.Namespace) -> int:
    import uvicorn

    from draftgate.drafters import NgramDrafter
    from draftgate.drafters.model import ModelDrafter
    from draftgate.server.workers.draft_worker import DraftService, create_draft_app

    _setup(a)
    if a.drafter == "ngram":
        service = DraftService(NgramDrafter(), max_sessions=a.max_sessions)
    else:
        if not a.model:
            raise ValueError("serve-draft --drafter model needs --model (a small model with the target's tokenizer)")
        runner = _runner(a)
        service = DraftService(ModelDrafter(runner, q_top_n=a.q_top_n), a.max_sessions, runner.vocab_size)
    print(f"draftgate: draft worker ({a.drafter}) on http://{a.host}:{a.port}", file=sys.stderr)
    uvicorn.run(create_draft_app(service), host=a.host, port=a.port, log_level=a.log_level)
    return 0
