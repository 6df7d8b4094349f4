"""SuffixDrafter: exact drafts on hand-built histories, and equality with a naive count table."""

from __future__ import annotations

import random
from collections import Counter, defaultdict, deque

import pytest

from draftgate.drafters import Drafter, DraftRequest, SuffixDrafter
from draftgate.drafters.suffix import SuffixMatch, _Node, _SuffixTrie
from draftgate.types import SamplingParams

Ctx = tuple[int, ...]


def _propose(d: SuffixDrafter, tokens: list[int], k: int, seq_id: int = 0) -> list[int]:
    (draft,) = d.propose([DraftRequest(seq_id, tokens, k, SamplingParams())])
    assert draft.q is None  # deterministic: one-hot q
    return draft.token_ids


def _finish(d: SuffixDrafter, seq_id: int, prompt: list[int], output: list[int]) -> None:
    """A request's life: first seen with its prompt, then the output, then release."""
    d.observe(seq_id, prompt, 0, 0)
    d.observe(seq_id, prompt + output, 0, 0)
    d.release(seq_id)


# -- a naive reference: explicit next-token counts of every context ---------


def _next_counts(texts: list[list[int]], depth: int) -> dict[Ctx, Counter[int]]:
    table: dict[Ctx, Counter[int]] = defaultdict(Counter)
    for text in texts:
        for start in range(len(text)):
            for end in range(start + 1, min(len(text), start + depth) + 1):
                table[tuple(text[start : end - 1])][text[end - 1]] += 1
    return table


def _ref_candidate(
    table: dict[Ctx, Counter[int]], hist: list[int], k: int, depth: int, min_prob: float
) -> tuple[list[int], float]:
    max_ctx = max(depth - k, depth // 2)
    for m in range(min(max_ctx, len(hist)), 0, -1):
        ctx = tuple(hist[len(hist) - m :])
        if sum(table.get(ctx, Counter()).values()) > 0:
            break
    else:
        return [], 0.0
    out: list[int] = []
    cum, score = 1.0, 0.0
    while len(out) < k and len(ctx) < depth:
        nxt = table.get(ctx)
        if not nxt:
            break
        tok, cnt = max(nxt.items(), key=lambda kv: (kv[1], -kv[0]))
        prob = cnt / sum(nxt.values())
        if prob < min_prob or cum * prob < min_prob:
            break
        cum *= prob
        out.append(tok)
        score += cum
        ctx = ctx + (tok,)
    return out, score


class _Reference:
    def __init__(self, depth: int, min_prob: float, capacity: int) -> None:
        self.depth, self.min_prob, self.capacity = depth, min_prob, capacity
        self.prompt_len: dict[int, int] = {}
        self.seen: dict[int, list[int]] = {}
        self.global_texts: deque[list[int]] = deque()

    def sync(self, seq: int, hist: list[int]) -> None:
        old = self.seen.get(seq)
        if old is None:
            self.prompt_len[seq] = len(hist)
        elif len(hist) < len(old) or (old and hist[len(old) - 1] != old[-1]):
            self.prompt_len[seq] = min(self.prompt_len[seq], len(hist))
        self.seen[seq] = list(hist)

    def propose(self, seq: int, hist: list[int], k: int) -> list[int]:
        self.sync(seq, hist)
        if k <= 0:
            return []
        local = _ref_candidate(_next_counts([hist], self.depth), hist, k, self.depth, self.min_prob)
        table = _next_counts(list(self.global_texts), self.depth)
        glob = _ref_candidate(table, hist, k, self.depth, self.min_prob)
        return glob[0] if glob[1] > local[1] else local[0]

    def release(self, seq: int) -> None:
        if seq not in self.seen:
            return
        out = self.seen.pop(seq)[self.prompt_len.pop(seq) :]
        if self.capacity and out:
            self.global_texts.append(out[-self.capacity :])
            while sum(map(len, self.global_texts)) > self.capacity:
                self.global_texts.popleft()


def _trie_counts(trie: _SuffixTrie) -> dict[Ctx, Counter[int]]:
    """Expand a trie (tails included) back into next-token counts, to check it directly."""
    table: dict[Ctx, Counter[int]] = defaultdict(Counter)

    def visit(node: _Node, ctx: Ctx) -> None:
        assert node.out == sum(c.count if isinstance(c, _Node) else 1 for c in node.children.values())
        for tok, child in node.children.items():
            if isinstance(child, _Node):
                table[ctx][tok] += child.count
                visit(child, ctx + (tok,))
            else:
                path = ctx
                for i in range(child.pos, min(len(child.text), child.pos + trie.max_depth - len(ctx))):
                    table[path][child.text[i]] += 1
                    path = path + (child.text[i],)

    visit(trie.root, ())
    return {c: n for c, n in table.items() if n}


# -- behaviour on hand-built histories --------------------------------------


def test_is_a_drafter() -> None:
    d = SuffixDrafter()
    assert isinstance(d, Drafter)
    assert d.name == "suffix"


def test_repeated_snippet_proposes_its_continuation() -> None:
    d = SuffixDrafter()
    hist = [1, 2, 3, 4, 5, 6, 9, 1, 2, 3]
    assert _propose(d, hist, k=3) == [4, 5, 6]
    assert _propose(d, hist, k=2) == [4, 5]  # k caps the draft
    assert _propose(d, hist, k=0) == []


def test_no_match_and_empty_history_give_empty_draft() -> None:
    d = SuffixDrafter()
    assert _propose(d, [1, 2, 3, 4], k=4) == []
    assert _propose(d, [], k=4, seq_id=1) == []


def test_longest_context_decides() -> None:
    # After (1, 2): 7 once, 8 once (tie). After (5, 1, 2): only 7.
    d = SuffixDrafter()
    assert _propose(d, [5, 1, 2, 7, 0, 1, 2, 8, 0, 5, 1, 2], k=1) == [7]


def test_global_cache_helps_a_request_repeating_an_earlier_output() -> None:
    first_output = [1, 2, 3, 4, 5, 6, 7, 8]
    second = [200, 201, 1, 2, 3]
    assert _propose(SuffixDrafter(), second, k=4) == []
    d = SuffixDrafter()
    _finish(d, seq_id=1, prompt=[100, 101], output=first_output)
    assert d.global_tokens == len(first_output)  # the output only, not the prompt
    assert _propose(d, second, k=4, seq_id=2) == [4, 5, 6, 7]


def test_min_prob_stops_low_confidence_extensions() -> None:
    outputs = [[1, 2, 3], [1, 2, 4], [1, 5, 6], [1, 5, 7]]
    hist = [9, 1]
    expected = {0.6: [], 0.3: [2], 0.2: [2, 3]}  # steps have p = 0.5, then 0.5 (cum 0.25)
    for min_prob, draft in expected.items():
        d = SuffixDrafter(min_prob=min_prob)
        for i, out in enumerate(outputs):
            _finish(d, seq_id=i, prompt=[0], output=out)
        assert _propose(d, hist, k=4, seq_id=99) == draft


def test_higher_scoring_candidate_wins() -> None:
    d = SuffixDrafter()
    _finish(d, seq_id=1, prompt=[0], output=[4, 5, 6, 7, 8])
    # Locally (4) was followed by 9 once: score 1. Globally by 5, 6, 7, 8: score 4.
    assert _propose(d, [4, 9, 4], k=4, seq_id=2) == [5, 6, 7, 8]


def test_capacity_evicts_oldest_whole_requests() -> None:
    d = SuffixDrafter(global_capacity_tokens=10)
    _finish(d, 1, [0], [11, 12, 13, 14, 15, 16])
    _finish(d, 2, [0], [21, 22, 23, 24, 25, 26])
    assert d.global_tokens == 6
    assert _propose(d, [11, 12], k=3, seq_id=3) == []
    assert _propose(d, [21, 22], k=3, seq_id=4) == [23, 24, 25]
    assert _trie_counts(d._global) == _next_counts([[21, 22, 23, 24, 25, 26]], d.max_depth)
    _finish(d, 5, [0], list(range(30, 50)))  # longer than the cache: keeps its last 10
    assert d.global_tokens == 10


def test_zero_capacity_disables_the_global_trie() -> None:
    d = SuffixDrafter(global_capacity_tokens=0)
    _finish(d, 1, [0], [1, 2, 3])
    assert d.global_tokens == 0
    assert _propose(d, [1, 2], k=1, seq_id=2) == []


def test_truncated_history_is_reindexed() -> None:
    d = SuffixDrafter()
    assert _propose(d, [1, 2, 3, 4, 1, 2, 3, 4, 1, 2], k=2) == [3, 4]
    assert _propose(d, [1, 2, 5, 1, 2], k=2) == [5, 1]
    assert _propose(d, [9, 8, 9, 8, 9], k=2) == [8, 9]  # same length, new last token


def test_depth_limit_is_shared_by_context_and_draft() -> None:
    d = SuffixDrafter(max_depth=4)
    hist = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    assert _propose(d, hist, k=1) == [4]  # context of 3 tokens, 1 drafted
    assert _propose(d, hist, k=3) == [4, 5]  # the context keeps half the depth: 2 tokens, 2 drafted
    assert _propose(d, hist, k=8) == [4, 5]


def test_a_large_k_does_not_draft_from_a_one_token_context() -> None:
    d = SuffixDrafter(max_depth=8)
    # After "5 1" comes 9 once; after "1" alone 2 comes twice: a one-token context would draft 2.
    hist = [1, 2, 0, 1, 2, 0, 5, 1, 9, 9, 7, 5, 1]
    assert _propose(d, hist, k=1) == [9]
    assert _propose(d, hist, k=24)[:1] == [9]  # K beyond the depth: the context still has 4 tokens


def test_bad_arguments_raise() -> None:
    for kwargs in ({"max_depth": 1}, {"min_prob": 1.5}, {"global_capacity_tokens": -1}):
        with pytest.raises(ValueError):
            SuffixDrafter(**kwargs)


@pytest.mark.parametrize(
    "depth,min_prob,capacity,vocab", [(24, 0.1, 40, 3), (5, 0.3, 25, 4), (3, 0.0, 0, 2), (8, 0.5, 60, 6)]
)
def test_incremental_equals_naive_reference_on_random_streams(
    depth: int, min_prob: float, capacity: int, vocab: int
) -> None:
    rng = random.Random(4321 + depth + capacity + vocab)
    d = SuffixDrafter(max_depth=depth, min_prob=min_prob, global_capacity_tokens=capacity)
    ref = _Reference(depth, min_prob, capacity)
    hists: dict[int, list[int]] = {0: [], 1: [], 2: []}
    for _ in range(300):
        seq = rng.randrange(3)
        hist = hists[seq]
        roll = rng.random()
        if roll < 0.04:
            del hist[rng.randrange(len(hist) + 1) :]  # caller truncated
        elif roll < 0.12:
            d.release(seq)
            ref.release(seq)
            hist.clear()
            hist.extend(rng.randrange(vocab) for _ in range(rng.randint(0, 3)))  # a new prompt
        else:
            hist.extend(rng.randrange(vocab) for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.5:
            d.observe(seq, hist, 0, 0)
            ref.sync(seq, hist)
        k = rng.randrange(7)
        assert _propose(d, hist, k, seq_id=seq) == ref.propose(seq, hist, k)
        assert d.global_tokens == sum(map(len, ref.global_texts))
    assert _trie_counts(d._global) == {c: n for c, n in _next_counts(list(ref.global_texts), depth).items() if n}


def test_long_history_keeps_few_active_suffixes() -> None:
    rng = random.Random(0)
    hist = [rng.randrange(1000) for _ in range(4000)]
    hist += hist[1000:1006]
    d = SuffixDrafter()
    assert _propose(d, hist, k=5) == hist[1006:1011]
    # Plain text repeats little, so a new token touches only a handful of suffixes.
    assert len(d._reqs[0].active) <= 8


def test_match_says_where_the_draft_came_from() -> None:
    d = SuffixDrafter()
    _finish(d, seq_id=1, prompt=[100, 101], output=[1, 2, 3, 4, 5, 6, 7, 8])
    own = d.match(2, [9, 4, 5, 6, 0, 9, 4, 5], 3)  # this request's own text: (9, 4, 5) -> 6, 0, 9
    assert (own.token_ids, own.from_global, own.depth) == ([6, 0, 9], False, 3)
    theirs = d.match(3, [200, 201, 1, 2, 3], 4)  # only the earlier output continues (1, 2, 3)
    assert (theirs.token_ids, theirs.from_global, theirs.depth) == ([4, 5, 6, 7], True, 3)
    assert theirs.score == 4.0 and _propose(d, [200, 201, 1, 2, 3], k=4, seq_id=3) == [4, 5, 6, 7]
    assert d.match(4, [300, 301], 4) == SuffixMatch([], False, 0, 0.0)
