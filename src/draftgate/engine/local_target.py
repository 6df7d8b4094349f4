"""LocalTarget: the round target on our own runner, in this process (the engine's default).

A round is one ragged forward over [pending token, drafts...] of every sequence, one
``verify_round`` call for all of them, and each sequence's KV cut back to its accepted prefix
(the rollback). A one-hot draft's tree nodes (``Draft.tree``) run in the same forward, in the
same sequence, under a tree attention mask (``ForwardItem.parents``); the path the target's
choices follow is kept and its KV moved into place (``ModelRunner.keep_path``).

Admission reserves each sequence's worst-case KV blocks (prompt + max tokens + one round of
drafts) so a running sequence can never run out of blocks mid-request. Tree nodes borrow free
blocks for their round only, or are skipped (``_trees``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch

from draftgate.drafters.base import FeatureReader, SparseQ
from draftgate.engine.round import Round
from draftgate.engine.target import NotNow, TargetInfo, check_prompt
from draftgate.errors import BadRequestError
from draftgate.models.runner import ForwardItem, ModelRunner
from draftgate.types import SamplingParams
from draftgate.verify import RoundDraft, target_choice, verify_round

__all__ = ["LocalTarget", "first_token", "NON_FINITE"]

NON_FINITE = (
    "the target model produced NaN or infinite logits for this request (numerical overflow in the "
    "model or its weights); the request cannot continue"
)


def first_token(logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor | None) -> int:
    """The token plain decoding picks after the prompt: logits [1, V], uniforms [1, 2] (output position 0)."""
    p = params
    u = uniforms if uniforms is not None else torch.zeros(1, 2, dtype=torch.float64)  # [1, 2]
    one = lambda v, dt: torch.tensor([v], dtype=dt)  # noqa: E731
    choice = target_choice(
        logits, one(p.temperature, torch.float32), one(p.top_k, torch.int64), one(p.top_p, torch.float32), u[:, 1]
    )
    return int(choice[0])


class LocalTarget:
    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        self.tokenizer = runner.tokenizer
        self.info = TargetInfo("local", runner.vocab_size, runner.config.max_position_embeddings)
        self._reserved: dict[int, int] = {}  # seq_id -> KV blocks held back for it
        self._reserved_total = 0
        self.tap: FeatureReader | None = None  # a drafter that reads the target's hidden states

    def set_feature_tap(self, tap: FeatureReader) -> None:
        """Every committed position's features go to ``tap.feed`` (prompt at open, then each round's)."""
        self.tap = tap

    def _blocks_for(self, n_tokens: int) -> int:
        return math.ceil(n_tokens / self.runner.block_size)

    def check(self, prompt_ids: Sequence[int], params: SamplingParams, k_max: int) -> None:
        check_prompt(prompt_ids, params.max_new_tokens, self.runner.vocab_size, self.info.max_context)
        need = self._blocks_for(len(prompt_ids) + params.max_new_tokens + k_max + 1)
        if need > self.runner.kv.num_blocks:
            raise BadRequestError(
                f"request needs {need} KV blocks but the cache has {self.runner.kv.num_blocks}; "
                "lower max_tokens or start the engine with more --kv-blocks"
            )

    def open(self, rnd: Round) -> None:
        prompt = list(rnd.history)
        need = self._blocks_for(len(prompt) + rnd.params.max_new_tokens + rnd.k_max + 1)
        if self._reserved_total + need > self.runner.kv.num_blocks:
            raise NotNow("waiting for running requests to free KV blocks")
        try:
            if self.tap is None:
                logits = self.runner.prefill(rnd.seq_id, prompt)[None]  # [1, V]
            else:
                last, start, feats = self.runner.prefill_features(rnd.seq_id, prompt, self.tap.feature_layers)
                logits = last[None]  # [1, V]
                self._feed(rnd.seq_id, start, feats)
            if not bool(torch.isfinite(logits).all()):
                self.runner.free(rnd.seq_id)
                rnd.fail(NON_FINITE)
                return
            first = first_token(logits, rnd.params, rnd.uniforms)
        except Exception as e:  # a failed prefill fails this sequence only (prefill freed its KV)
            self.runner.free(rnd.seq_id)
            rnd.fail(f"{type(e).__name__}: {e}")
            return
        self._reserved[rnd.seq_id] = need
        self._reserved_total += need
        rnd.done([first])

    def run(self, rounds: Sequence[Round]) -> None:
        # 1. Each one-hot draft tree (Draft.tree) runs in the same forward, where spare KV blocks allow.
        trees = self._trees(rounds)
        # 2. One batched forward over [pending, drafts..., tree nodes...] per sequence.
        items = [_forward_item(r, tree) for r, tree in zip(rounds, trees, strict=True)]
        # logits [sum of rows, V], argmax (-1: not finite), and the tap's features when one reads them
        layers = self.tap.feature_layers if self.tap is not None else None
        out = self.runner.forward_flat(items) if layers is None else self.runner.forward_flat(items, layers)
        # A sequence whose logits hold a NaN or an inf ends with an error; the others are verified.
        bounds, start = [], 0
        for it in items:
            bounds.append((start, start + it.num_logits))
            start += it.num_logits
        ok = list(range(len(rounds)))
        logits, argmax = out.logits, out.argmax
        if bool((argmax < 0).any()):  # the good sequences' rows only
            ok = [i for i, (a, b) in enumerate(bounds) if not bool((argmax[a:b] < 0).any())]
            rows = torch.cat([torch.arange(*bounds[i]) for i in ok]) if ok else torch.empty(0, dtype=torch.int64)
            logits, argmax = logits[rows], argmax[rows]
        if ok:
            # 3. Verify the whole round in one call.
            outcome = verify_round(logits, [_round_draft(rounds[i], trees[i]) for i in ok], argmax)
            for i, emitted, path in zip(ok, outcome.emitted, outcome.paths, strict=True):
                r = rounds[i]
                # 4. Roll back to the accepted path: KV keeps the pending token + accepted drafts, in place.
                self.runner.keep_path(r.seq_id, len(r.history) - 1, [0, *path])
                r.done(emitted, len(path), branch_rows=len(trees[i]))
                if out.features is not None:  # committed: the pending token and the accepted drafts
                    b0, chain = bounds[i][0], path == list(range(1, len(path) + 1))
                    rows_kept = slice(b0, b0 + 1 + len(path)) if chain else [b0 + j for j in (0, *path)]
                    self._feed(r.seq_id, len(r.history) - 1, out.features[rows_kept])
        for i in set(range(len(rounds))) - set(ok):
            self.runner.truncate(rounds[i].seq_id, len(rounds[i].history) - 1)  # its round's KV is garbage
            rounds[i].fail(NON_FINITE)

    def _trees(self, rounds: Sequence[Round]) -> list[tuple[tuple[int, int], ...]]:
        """Each sequence's draft tree nodes this round: its draft's, where the cache has the blocks to spare.

        A tree's nodes take KV slots for the round only (``keep_path`` keeps one path); without the
        blocks a tree is skipped and the round verifies its chain, as a target without trees would.
        """
        kv = self.runner.kv
        need = [kv.blocks_needed(r.seq_id, len(r.draft.token_ids) + 1) for r in rounds]
        spare = kv.num_available_blocks - sum(need)
        trees: list[tuple[tuple[int, int], ...]] = []
        for r, n in zip(rounds, need, strict=True):
            tree = r.draft.tree if r.draft.q is None else ()
            more = kv.blocks_needed(r.seq_id, len(r.draft.token_ids) + 1 + len(tree)) - n if tree else 0
            if more > spare:
                tree, more = (), 0
            spare -= more
            trees.append(tree)
        return trees

    def _feed(self, seq_id: int, start: int, feats: torch.Tensor) -> None:
        assert self.tap is not None
        try:
            self.tap.feed(seq_id, start, feats)
        except Exception:  # a failing drafter must not fail the target: it drafts nothing (a gap)
            logging.getLogger(__name__).exception("feature tap failed for sequence %d", seq_id)

    def close(self, seq_id: int) -> None:
        self.runner.free(seq_id)
        self._reserved_total -= self._reserved.pop(seq_id, 0)

    @property
    def reserved_blocks(self) -> int:
        return self._reserved_total

    def kv_stats(self) -> dict[str, int]:
        return self.runner.kv.stats()

    def shutdown(self) -> None:
        pass  # the runner's memory goes with it


def _forward_item(r: Round, tree: tuple[tuple[int, int], ...]) -> ForwardItem:
    """The round's rows for the forward: [pending token, drafts..., tree nodes...], one logit row each."""
    drafts = r.draft.token_ids
    parents = [-1, *range(len(drafts)), *(p for p, _ in tree)] if tree else None
    return ForwardItem(
        r.seq_id, [r.history[-1], *drafts, *(t for _, t in tree)], len(drafts) + 1 + len(tree), parents=parents
    )


def _round_draft(r: Round, tree: tuple[tuple[int, int], ...]) -> RoundDraft:
    """What verify_round needs of ``r``'s draft, with the tree nodes this round runs."""
    d, p = r.draft, r.params
    q = (d.q.ids, d.q.probs) if isinstance(d.q, SparseQ) else d.q
    return RoundDraft(d.token_ids, p.temperature, p.top_k, p.top_p, r.uniforms, q, tree)
