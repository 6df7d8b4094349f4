"""The target's states for training a draft head, in one pass: continuation, top-k logits, features.

Every position's logits and hidden states come from the forward that computes them anyway: the
prompt's prefill (all its rows), then the decode step that feeds each generated token. A first
version generated the continuations on the engine and ran one more forward over every finished
sequence for its logits and features; on this CPU that second pass cost about as much as
generating (a prefill is compute-bound, like a batch of 16 decode rows), so generating and
recording at once halves the data time (docs/BENCHMARKS.md).

Decoding is continuous batching by hand on one ``ModelRunner`` (up to ``batch`` sequences a
step, a finished one replaced by the next prompt; 32 rows make 1.3x the tokens a second of 16).
Continuation 0 of a prompt is the target's greedy one (the native kernels are batch invariant, so
it is plain decoding's, token for token); continuations 1.. are sampled at ``temperature`` with a
seeded generator: more of the target's own text from the same prompts (their labels are the
target's logits at every position either way).

On CUDA (``device``) the runner is PyTorch's forward on the GPU and a step's outputs come back to
the CPU in one copy each; what is returned always lives on the CPU.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from draftgate.models.loader import LoadedModel
from draftgate.models.runner import ForwardItem, ModelRunner
from draftgate.train.data import Record

__all__ = ["States", "generate_states", "sample_rows"]


@dataclass
class States:
    """One sequence's teacher signal: rows 0..T-2 (row t is about the token at t + 1)."""

    tokens: torch.Tensor  # [T] int64
    start: int  # first generated position
    feats: torch.Tensor  # [T-1, nF, C] float16
    top_v: torch.Tensor  # [T-1, k] float16 top-k logits
    top_i: torch.Tensor  # [T-1, k] int32 their ids


@dataclass
class _Live:
    index: int  # output slot
    tokens: list[int]
    start: int
    left: int  # tokens still to generate
    greedy: bool
    feats: list[torch.Tensor]  # pieces [n, nF, C] float16
    top_v: list[torch.Tensor]  # pieces [n, k]
    top_i: list[torch.Tensor]


def sample_rows(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> list[int]:
    """One token per row of ``logits`` [r, V] from softmax(logits / temperature), by one inverse-CDF
    draw for all rows (``torch.multinomial`` took 1.6 ms a row at V = 49152, 15% of the data time)."""
    cdf = torch.softmax(logits.float() / temperature, dim=-1).cumsum(-1)  # [r, V]
    u = torch.rand(logits.shape[0], 1, generator=gen).to(cdf.device) * cdf[:, -1:]  # [r, 1] (gen: CPU)
    return torch.searchsorted(cdf, u, right=True).clamp_max(logits.shape[-1] - 1)[:, 0].tolist()


@torch.inference_mode()
def generate_states(
    target: LoadedModel,
    records: Sequence[Record],
    layers: Sequence[int],
    top_k: int,
    max_new_tokens: int,
    max_len: int,
    continuations: int = 1,
    temperature: float = 0.8,
    seed: int = 0,
    batch: int = 32,
    chunk: int = 256,
    progress: bool = True,
    device: str | torch.device = "cpu",
    deadline: float | None = None,
    tally: dict[str, int] | None = None,
) -> list[States]:
    """Per usable record (prompts: ``continuations`` each; texts: one), its ``States``, in order (on the CPU).

    ``deadline`` (a ``time.perf_counter()`` value): no sequence starts after it; the ones under way
    finish, and only the finished ones are returned (still in order). With a deadline the
    sequences are started in a seeded random order, so a cut-short set is a sample of every file,
    not the first file's prompts. ``tally`` receives ``requested`` and ``generated`` counts.
    """
    tok, cfg = target.tokenizer, target.config
    limit = min(max_len, cfg.max_position_embeddings)
    eos = set(cfg.eos_token_ids)
    work: list[tuple[list[int], int, bool]] = []  # (prompt ids, tokens to generate, greedy)
    for r in records:
        if r.text is not None:
            ids = tok.encode(r.text)[:limit]
            if len(ids) >= 2:
                work.append((ids, 0, True))
        else:
            ids = tok.encode_chat(list(r.messages))
            if len(ids) + max_new_tokens <= limit:
                work.extend((ids, max_new_tokens, c == 0) for c in range(continuations))
    order = list(range(len(work)))
    if deadline is not None:  # a cut-short set samples every file
        order = torch.randperm(len(work), generator=torch.Generator().manual_seed(seed)).tolist()
    todo = deque((i, *work[i]) for i in order)  # (output slot, ids, tokens to generate, greedy)
    out: list[States | None] = [None] * len(todo)
    runner = ModelRunner(target, device, num_blocks=batch * ((limit + 15) // 16 + 1) + 8, enable_prefix_cache=False)
    gen = torch.Generator().manual_seed(seed)
    live: dict[int, _Live] = {}
    bar = tqdm(total=len(todo), desc="target states", unit="seq", disable=not progress)

    def top(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # logits [n, V] -> [n, k] each, CPU
        v, i = logits.topk(top_k, dim=-1)
        return v.half().cpu(), i.int().cpu()

    def keep(s: _Live, top_v: torch.Tensor, top_i: torch.Tensor, feats: torch.Tensor) -> None:  # rows of s
        s.top_v.append(top_v)
        s.top_i.append(top_i)
        s.feats.append(feats)

    def choose(seqs: Sequence[_Live], logits: torch.Tensor, argmax: torch.Tensor) -> list[int]:
        """Each sequence's next token from its row of ``logits`` [n, V] (``argmax`` [n])."""
        if bool((argmax < 0).any()):
            raise RuntimeError("the target produced a non-finite logit row while generating training data")
        picks = argmax.tolist()
        rows = [b for b, s in enumerate(seqs) if not s.greedy]
        if rows:
            for b, t in zip(rows, sample_rows(logits[rows], temperature, gen), strict=True):
                picks[b] = t  # the sampled continuations' rows
        return picks

    def finish(sid: int) -> None:
        s = live.pop(sid)
        runner.free(sid)
        cat = lambda xs: torch.cat(xs)[: len(s.tokens) - 1]  # noqa: E731  # rows 0..T-2
        out[s.index] = States(torch.tensor(s.tokens), s.start, cat(s.feats), cat(s.top_v), cat(s.top_i))
        bar.update(1)

    def admit(index: int, ids: list[int], n_new: int, greedy: bool) -> None:
        sid = index
        s = live[sid] = _Live(index, list(ids), len(ids) if n_new else 1, n_new, greedy, [], [], [])
        runner.add_sequence(sid, ids)
        rows = ids if n_new else ids[:-1]  # a text's last token has no next one to learn
        res = None
        for a in range(0, len(rows), chunk):
            piece = rows[a : a + chunk]
            res = runner.forward_flat([ForwardItem(sid, piece, len(piece))], layers)  # every row's logits
            assert res.features is not None
            keep(s, *top(res.logits), res.features.half().cpu())
        if not n_new:
            finish(sid)
            return
        assert res is not None
        s.tokens.append(choose([s], res.logits[-1:], res.argmax[-1:])[0])
        s.left -= 1
        if s.left == 0 or s.tokens[-1] in eos:
            finish(sid)

    try:
        while todo or live:
            if deadline is not None and todo and len(todo) < len(out) and time.perf_counter() >= deadline:
                todo.clear()  # the data budget is spent (after a first batch at least): finish what is under way
            while todo and len(live) < batch:
                admit(*todo.popleft())
            if not live:
                continue
            seqs = list(live.values())
            res = runner.forward_flat([ForwardItem(s.index, s.tokens[-1:], 1) for s in seqs], layers)
            assert res.features is not None
            picks = choose(seqs, res.logits, res.argmax)
            top_v, top_i = top(res.logits)  # one top-k for the step's rows
            feats = res.features.half().cpu()  # [n, nF, C]
            for b, s in enumerate(seqs):
                keep(s, top_v[b : b + 1], top_i[b : b + 1], feats[b : b + 1])
                s.tokens.append(picks[b])
                s.left -= 1
                if s.left == 0 or s.tokens[-1] in eos:
                    finish(s.index)
    finally:
        bar.close()
        for sid in list(live):
            runner.free(sid)
    done = [s for s in out if s is not None]
    if tally is not None:
        tally.update(requested=len(out), generated=len(done))
    return done
