"""`eagle`: drafts from the target's own hidden states through a trained head (models/eagle.py).

The target (our runner, in this process) hands the drafter its features for every position it
commits: the prompt at prefill, then the pending token and the accepted drafts of each round
(``feed``; the engine wires it to ``LocalTarget``). The head keeps one entry per committed
position; a draft of K tokens is one head pass over the positions committed since the last draft
(its output at the last one gives draft 1) and K - 1 chain steps, each on the head's own output
of the step before. Draft entries are dropped after the draft: the next round rebuilds from the
target's true features, so a rejected draft needs no other rollback.

STOPPING: the head is well calibrated (its drafts are accepted about as often as the probability
it gives them), so a chain stops where the product of its drafts' probabilities falls below
``min_confidence`` (EAGLE-2's signal): the controller's K is the most a round drafts, the head's
confidence cuts it short. The head step for the next token runs only while that product is at
least ``min_continue`` (twice the bar by default: the next draft would need a probability of 0.5
or more to pass). Without that rule about 2 of every 3 chain steps compute a token the bar then
cuts; with it a round's draft costs about a quarter less for almost no fewer accepted tokens.

TREE: beside each chain token the draft carries the head's runner-up for that position as a leaf
(``Draft.tree``) where the path to it is likely enough: the chain's confidence before it times the
head's probability of the runner-up at least ``min_branch`` (0.15 by default; EAGLE-2 ranks a
tree's nodes by the same product). The local target verifies the tree in the same forward under a
tree attention mask, one row a leaf, and keeps the path the target's choices follow. On open chat
the head's first draft is wrong in about half the rounds, and its runner-up is then often the
target's choice (docs/BENCHMARKS.md). A leaf costs no head step: the head computed its q for the
chain token anyway.

Every draft is one-hot, verified by matching the target's own choice, so the output is plain
decoding's token for token: greedy drafts are the head's argmax; a sampling request's drafts are
coupled to the target's draw: draft i is the token the target's inverse-CDF sample with its own
uniform for that position (``DraftRequest.uniforms``) would pick if the target's distribution
were the head's, after the request's temperature, top-k and top-p. When the head is close to the
target the two draws coincide, so sampling speculates too, and a seed gives exactly the tokens
plain sampling gives with that seed (rejection sampling with the head's q would keep only the
distribution).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from draftgate.drafters.base import Abilities, Draft, DraftRequest
from draftgate.errors import ModelLoadError
from draftgate.models.eagle import EagleHead, HeadCache
from draftgate.models.eagle_format import check_target
from draftgate.models.loader import LoadedModel
from draftgate.sampling.transforms import logits_to_probs, sample_from_probs

__all__ = ["EagleDrafter", "shipped_head", "load_head"]

JOIN_EVERY = 64  # fed feature tensors a sequence keeps apart before they are joined


@dataclass
class _Seq:
    # The target's features not yet absorbed by the head, positions g_start .. g_start + g_n - 1, as
    # they were fed ([m, nF, C] each); joined only when the head absorbs them.
    parts: list[torch.Tensor]
    g_start: int = 0
    g_n: int = 0
    cache: HeadCache | None = None
    last_h: torch.Tensor | None = None  # [C] the head's output at its last true entry
    last_logits: torch.Tensor | None = None  # [Vs] its logits (draft 1's)

    def features(self) -> torch.Tensor:
        """[g_n, nF, C] the features not yet absorbed, joined into one tensor."""
        if len(self.parts) > 1:
            self.parts[:] = [torch.cat(self.parts)]
        return self.parts[0]


class EagleDrafter:
    name = "eagle"
    sampled_q = False  # one-hot drafts only (coupled to the target's uniforms when sampling)

    def __init__(
        self,
        head: EagleHead,
        min_confidence: float = 0.15,
        min_continue: float | None = None,
        min_branch: float | None = 0.15,
    ) -> None:
        """``min_confidence``: a chain stops before the token at which the product of the head's
        probabilities of its drafts would fall below this (0: always K tokens; see STOPPING).
        ``min_continue`` (default ``2 * min_confidence``, at most 1): a chain runs the head step for its next
        token only while that product is at least this, i.e. only while the next token could
        pass ``min_confidence`` with a probability of at most ``min_confidence / min_continue``
        (see STOPPING). ``min_branch``: the head's second choice for a chain token goes with the
        draft as a leaf of its tree (``Draft.tree``) where the chain's confidence before it times the
        head's probability of it is at least this (None: never; see TREE)."""
        if not 0.0 <= min_confidence < 1.0:
            raise ValueError(f"min_confidence must be in [0, 1), got {min_confidence!r}")
        cont = min(1.0, 2 * min_confidence) if min_continue is None else min_continue
        if not min_confidence <= cont <= 1.0:
            raise ValueError(f"min_continue must be in [min_confidence, 1], got {min_continue!r}")
        if min_branch is not None and not 0.0 < min_branch <= 1.0:
            raise ValueError(f"min_branch must be in (0, 1] or None, got {min_branch!r}")
        self.min_confidence, self.min_continue, self.min_branch = min_confidence, cont, min_branch
        self.head = head.eval().prepare()  # its first draft call is not a cold one
        self.feature_layers = head.feature_layers
        self.abilities = Abilities(features=self)
        self._seqs: dict[int, _Seq] = {}

    # ------------------------------------------------------------ the target's side

    def feed(self, seq_id: int, start: int, feats: torch.Tensor) -> None:
        """The target's features [m, nF, C] at positions start .. start + m - 1 (committed).

        Kept as they come (no copy: the engine calls this every round) and joined only when the
        head absorbs them (one product for all the positions since its last draft).
        """
        s = self._seqs.get(seq_id)
        if s is None or start != s.g_start + s.g_n:  # new, or a gap (never expected): start over here
            s = self._seqs[seq_id] = _Seq([], start)
        s.parts.append(feats)
        s.g_n += feats.shape[0]
        if len(s.parts) >= JOIN_EVERY:  # a long stretch without drafts holds a few tensors, not one a round
            s.features()

    # ------------------------------------------------------------ Drafter protocol

    @torch.inference_mode()
    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        """Drafts for a batch: every head pass runs once over all the requests still drafting, so
        a step streams the head's weights once, not once a request."""
        head = self.head
        drafts = [Draft([]) for _ in requests]
        live = [(i, r, s) for i, r in enumerate(requests) if r.k > 0 and (s := self._ready(r)) is not None]
        absorb = [(r, s) for _, r, s in live if s.cache is not None and s.cache.start + s.cache.n <= len(r.tokens) - 2]
        if absorb:  # the true entries since each one's last draft: positions first..last = n - 2
            caches, toks, feats = [], [], []
            for r, s in absorb:
                c = s.cache
                assert c is not None
                first, last = c.start + c.n, len(r.tokens) - 2
                caches.append(c)
                toks.append(torch.tensor(r.tokens[first + 1 : last + 2], dtype=torch.int64))  # x_{t+1}
                feats.append(s.features()[first - s.g_start : last - s.g_start + 1])  # [m, nF, C]
            h, logits = head.step_many(caches, toks, feats=feats)  # [B, C], [B, Vs]
            for b, (r, s) in enumerate(absorb):
                s.last_h, s.last_logits = h[b], logits[b]
                self._drop_absorbed(s, len(r.tokens) - 2)
        live = [(i, r, s) for i, r, s in live if self._synced(r, s)]
        true_n = [s.cache.n for _, _, s in live]  # type: ignore[union-attr]
        ids: list[list[int]] = [[] for _ in live]
        cur = [(s.last_h, s.last_logits) for _, _, s in live]
        conf = [1.0] * len(live)  # product of the head's probabilities of each chain's drafts
        tree: list[list[tuple[int, int]]] = [[] for _ in live]  # each chain's runner-up leaves (see TREE)
        try:
            for step in range(max((r.k for _, r, _ in live), default=0)):
                more = []  # live indices that draft token step + 1
                for j, (_, r, _) in enumerate(live):
                    if step < r.k and conf[j] >= self.min_confidence:  # below it, the chain has ended
                        q, at = self._choose(r, cur[j][1], step)  # type: ignore[arg-type]
                        tok, p = int(self.head.vocab_ids[at]), float(q[at])
                        before = conf[j]
                        conf[j] *= p
                        if conf[j] < self.min_confidence:
                            continue  # too unlikely to be accepted: the chain ends before it
                        if self.min_branch is not None and (leaf := self._runner_up(q, at, before)) is not None:
                            tree[j].append((step, leaf))  # a sibling of chain node step + 1
                        ids[j].append(tok)
                        if step + 1 < r.k and conf[j] >= self.min_continue:
                            more.append(j)
                if not more:
                    break
                h, logits = head.step_many(
                    [live[j][2].cache for j in more],  # type: ignore[misc]
                    [torch.tensor([ids[j][-1]]) for j in more],
                    g=[cur[j][0][None] for j in more],  # type: ignore[index]
                )  # [B', C], [B', Vs]
                for b, j in enumerate(more):
                    cur[j] = (h[b], logits[b])
        finally:
            for (_, _, s), n in zip(live, true_n, strict=True):
                head.truncate(s.cache, n)  # type: ignore[arg-type]  # draft entries never stay
        for (i, _, _), d, t in zip(live, ids, tree, strict=True):
            drafts[i] = Draft(d, tree=tuple(t))
        return drafts

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        pass  # the target's features (feed) are all the head needs

    def release(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    # ------------------------------------------------------------ drafting

    def _ready(self, r: DraftRequest) -> _Seq | None:
        """The request's state with a head cache, or None: no features up to the pending token's predecessor."""
        s = self._seqs.get(r.seq_id)
        n = len(r.tokens)  # the pending token r.tokens[-1] sits at position n - 1
        if s is None or s.g_start + s.g_n < n - 1 or n < 2:
            return None
        if s.cache is None:
            s.cache = self.head.new_cache(max(256, s.g_n + 64), start=s.g_start)
        if s.cache.start + s.cache.n < s.g_start:
            return None  # the head lacks entries whose features are gone (never in the engine)
        return s

    @staticmethod
    def _drop_absorbed(s: _Seq, last: int) -> None:
        """Forget the raw features up to position ``last`` (in the head's cache now): a long request
        keeps the features of the positions its head has not absorbed yet, not all of them."""
        used = last - s.g_start + 1
        rest = s.g_n - used
        s.parts = [s.features()[used:].clone()] if rest > 0 else []
        s.g_start, s.g_n = last + 1, max(rest, 0)

    @staticmethod
    def _synced(r: DraftRequest, s: _Seq) -> bool:
        """The head holds exactly the true entries up to the pending token's predecessor, and their output."""
        c = s.cache
        return (
            c is not None and c.start + c.n == len(r.tokens) - 1 and s.last_h is not None and s.last_logits is not None
        )

    def _runner_up(self, q: torch.Tensor, at: int, conf: float) -> int | None:
        """The head's runner-up token beside a draft at subset index ``at`` of q [Vs], on a path of
        confidence ``conf``, if the path to it is likely enough (``min_branch``)."""
        assert self.min_branch is not None
        top2 = torch.topk(q, 2)
        j = int(top2.indices[1]) if int(top2.indices[0]) == at else int(top2.indices[0])
        return int(self.head.vocab_ids[j]) if conf * float(q[j]) >= self.min_branch else None

    def _choose(self, r: DraftRequest, logits: torch.Tensor, i: int) -> tuple[torch.Tensor, int]:
        """Draft token i from the head's logits [Vs]: the head's q [Vs] and the drafted subset index.

        Greedy: its argmax (probability at temperature 1); sampling: the token the target's own
        draw (u_sample of row i) picks if the target's distribution were the head's (its q).
        """
        p = r.params
        if p.greedy or r.uniforms is None:
            q = torch.softmax(logits, dim=-1)  # [Vs]
            j = int(q.argmax())
        else:
            q = logits_to_probs(logits[None], p.temperature, p.top_k, p.top_p)[0]  # [Vs]
            j = int(sample_from_probs(q[None], r.uniforms[i : i + 1, 1]))
        return q, j


def shipped_head(target: LoadedModel) -> Path | None:
    """The head shipped with the package for this target (matched by its fingerprint), if any."""
    root = Path(str(resources.files("draftgate.data"))) / "heads"
    if not root.is_dir():
        return None
    for folder in sorted(p for p in root.iterdir() if (p / "head.json").is_file()):
        try:
            check_target(json.loads((folder / "head.json").read_text()), target.config, target.weights, str(folder))
        except (ModelLoadError, ValueError):
            continue
        return folder
    return None


def load_head(path: str | Path | None, target: LoadedModel) -> EagleHead:
    """A head folder (None: the one shipped for this target); refused, with the reason, for another target."""
    folder = Path(path) if path is not None else shipped_head(target)
    if folder is None:
        raise ModelLoadError(
            f"no draft head is shipped for {target.source}: train one with `draftgate distill --kind eagle "
            "--out DIR` and pass --draft-head DIR"
        )
    return EagleHead.load(folder, target.config, target.weights)
