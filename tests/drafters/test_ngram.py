"""NgramDrafter: exact drafts on hand-built histories, and incremental == naive rebuild."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from draftgate.drafters import Drafter, DraftRequest, NgramDrafter, ngram
from draftgate.types import SamplingParams


def _req(tokens: list[int], k: int, seq_id: int = 0) -> DraftRequest:
    return DraftRequest(seq_id=seq_id, tokens=tokens, k=k, params=SamplingParams())


def _propose(d: NgramDrafter, tokens: list[int], k: int, seq_id: int = 0) -> list[int]:
    (draft,) = d.propose([_req(tokens, k, seq_id)])
    assert draft.q is None  # deterministic: one-hot q
    return draft.token_ids


def _reference(hist: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Naive scan: longest n first, latest earlier occurrence, overlapping copy."""
    size = len(hist)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = hist[size - n :]
        for end in range(size - 1, n - 1, -1):
            if hist[end - n : end] == suffix:
                out: list[int] = []
                for i in range(k):
                    out.append(hist[end + i] if end + i < size else out[end + i - size])
                return out
    return []


def test_is_a_drafter() -> None:
    d = NgramDrafter()
    assert isinstance(d, Drafter)
    assert d.name == "ngram"


def test_repeated_snippet_proposes_its_continuation() -> None:
    # "for i in range ( n ) :" ... later "for i in range" -> "( n ) :"
    code = [10, 11, 12, 13, 14, 15, 16, 17]
    hist = code + [99, 98] + code[:4]
    assert _propose(NgramDrafter(), hist, k=4) == [14, 15, 16, 17]


def test_k_caps_the_draft_and_zero_k_gives_nothing() -> None:
    hist = [1, 2, 3, 4, 5, 6, 9, 1, 2, 3]
    d = NgramDrafter()
    assert _propose(d, hist, k=2) == [4, 5]
    assert _propose(d, hist, k=0) == []


def test_no_match_gives_empty_draft() -> None:
    d = NgramDrafter()
    assert _propose(d, [1, 2, 3, 4], k=4) == []
    assert _propose(d, [], k=4, seq_id=1) == []
    assert _propose(d, [7], k=4, seq_id=2) == []


def test_most_recent_match_wins_but_longer_n_first() -> None:
    d = NgramDrafter(min_n=1, max_n=3)
    assert _propose(d, [1, 2, 7, 1, 2, 8, 1, 2], k=1) == [8]  # latest of two (1, 2)
    assert _propose(d, [5, 1, 2, 7, 1, 2, 8, 5, 1, 2], k=1, seq_id=1) == [7]  # (5, 1, 2) beats it


def test_overlapping_copy_extends_a_period() -> None:
    d = NgramDrafter()
    assert _propose(d, [7, 7, 7], k=4) == [7, 7, 7, 7]
    assert _propose(d, [1, 2, 1, 2], k=5, seq_id=1) == [1, 2, 1, 2, 1]


def test_min_n_excludes_short_matches() -> None:
    d = NgramDrafter(min_n=2, max_n=3)
    assert _propose(d, [1, 5, 6, 2, 1], k=3) == []  # only a 1-gram matches
    assert _propose(d, [1, 5, 6, 2, 1, 5], k=2, seq_id=1) == [6, 2]


def test_incremental_observe_matches_fresh_drafter() -> None:
    hist = [int(c) for c in "314159265358979323846264338327950288"]  # digits of pi
    d = NgramDrafter()
    for cut in range(len(hist) + 1):
        d.observe(0, hist[:cut], num_drafted=0, num_accepted=0)
        assert _propose(d, hist[:cut], k=3) == _propose(NgramDrafter(), hist[:cut], k=3)


def test_truncated_history_is_reindexed() -> None:
    d = NgramDrafter()
    long = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    assert _propose(d, long, k=2) == [3, 4]
    short = [1, 2, 5, 1, 2]  # shorter than last seen, and different
    assert _propose(d, short, k=2) == [5, 1]
    same_len = [9, 8, 9, 8, 9]  # same length, different last token
    assert _propose(d, same_len, k=2) == [8, 9]


def test_release_drops_state_and_sequences_are_independent() -> None:
    d = NgramDrafter()
    a, b = [1, 2, 3, 1, 2], [4, 5, 6, 4]
    drafts = d.propose([_req(a, 2, seq_id=1), _req(b, 2, seq_id=2)])
    assert [x.token_ids for x in drafts] == [[3, 1], [5, 6]]
    assert d.num_sequences == 2
    d.release(1)
    d.release(1)  # releasing twice (or an unknown id) is a no-op
    assert d.num_sequences == 1
    assert _propose(d, [8, 9, 8], k=1, seq_id=1) == [9]


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError):
        NgramDrafter(min_n=0)
    with pytest.raises(ValueError):
        NgramDrafter(min_n=3, max_n=2)


@pytest.mark.parametrize("min_n,max_n,vocab", [(1, 4, 3), (2, 3, 5), (1, 1, 2), (3, 6, 4)])
def test_incremental_equals_naive_reference_on_random_streams(min_n: int, max_n: int, vocab: int) -> None:
    rng = random.Random(1234 + 7 * min_n + max_n + vocab)
    d = NgramDrafter(min_n=min_n, max_n=max_n)
    hists: dict[int, list[int]] = {0: [], 1: []}
    for _ in range(400):
        seq = rng.randrange(2)
        hist = hists[seq]
        roll = rng.random()
        if roll < 0.05:
            del hist[rng.randrange(len(hist) + 1) :]  # caller truncated
        elif roll < 0.08:
            d.release(seq)
        else:
            hist.extend(rng.randrange(vocab) for _ in range(rng.randint(1, 4)))
        if rng.random() < 0.5:
            d.observe(seq, hist, num_drafted=0, num_accepted=0)
        k = rng.randrange(8)
        assert _propose(d, hist, k, seq_id=seq) == _reference(hist, k, min_n, max_n)


class _SpyHistory(Sequence[int]):
    """A caller's history that records the lowest position the drafter read from it."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.lowest_read: int | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i):  # type: ignore[no-untyped-def,override]
        idx = range(len(self.tokens))[i]
        if isinstance(i, slice):
            if len(idx):
                self._read(min(idx))
        else:
            self._read(idx)
        return self.tokens[i]

    def _read(self, pos: int) -> None:
        self.lowest_read = pos if self.lowest_read is None else min(self.lowest_read, pos)


class _CountingList(list):  # type: ignore[type-arg]
    """The drafter's own copy of a history, counting the elements read from it."""

    reads = 0

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        got = super().__getitem__(i)
        self.reads += len(got) if isinstance(i, slice) else 1
        return got

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.reads += len(self)
        return super().__iter__()


def _long_history(filler: int) -> tuple[list[int], int]:
    """A fixed 300-token text, ``filler`` tokens that never occur in it, then a copy of part of the
    text; and where the copied part's continuation starts (a scan back to it crosses the filler)."""
    rng = random.Random(0)
    text = [rng.randrange(50) for _ in range(300)]
    return text + [100 + i % 50 for i in range(filler)] + text[100:110], 110


def test_a_round_reads_only_the_new_tokens_of_the_callers_history() -> None:
    hist, at = _long_history(4000)
    spy = _SpyHistory(hist)
    d = NgramDrafter()
    (draft,) = d.propose([_req(spy, 5)])  # type: ignore[arg-type]
    assert draft.token_ids == hist[at : at + 5]  # what followed the copied part
    assert spy.lowest_read == 0  # the first round indexes the whole history (the spy sees reads)
    seen = len(hist)
    hist += hist[at : at + 2]  # two accepted tokens
    spy.lowest_read = None
    d.observe(0, spy, num_drafted=5, num_accepted=2)  # type: ignore[arg-type]
    (draft,) = d.propose([_req(spy, 3)])  # type: ignore[arg-type]
    assert draft.token_ids == hist[at + 2 : at + 5]
    # Only the last token it had indexed (to check the history only grew) and the new ones.
    assert spy.lowest_read == seen - 1


def test_a_round_costs_the_same_however_long_the_history(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[_CountingList] = []

    class CountingIndex(ngram._SeqIndex):
        def __init__(self) -> None:
            super().__init__()
            self.tokens = _CountingList()
            made.append(self.tokens)

    monkeypatch.setattr(ngram, "_SeqIndex", CountingIndex)

    def reads_of_next_round(filler: int) -> int:
        hist, at = _long_history(filler)
        d = NgramDrafter()
        assert _propose(d, hist, k=5) == hist[at : at + 5]
        hist += hist[at : at + 2]
        (own,) = made[-1:]
        own.reads = 0
        d.observe(0, hist, num_drafted=5, num_accepted=2)
        assert _propose(d, hist, k=3) == hist[at + 2 : at + 5]
        return own.reads

    short, long = reads_of_next_round(100), reads_of_next_round(8000)
    assert 0 < short == long  # a few dict look-ups, not a scan of 8000 more tokens


def test_drafts_come_from_the_index_not_a_rescan_of_the_history() -> None:
    # The index assumes append-only histories: a history of the same length and last token is not
    # re-read, so a change before its end is invisible. A drafter that rescanned would follow it.
    d = NgramDrafter()
    assert _propose(d, [1, 2, 3, 4, 9, 1, 2], k=2) == [3, 4]
    assert _propose(d, [1, 2, 7, 7, 9, 1, 2], k=2) == [3, 4]
    assert _propose(NgramDrafter(), [1, 2, 7, 7, 9, 1, 2], k=2) == [7, 7]  # what a rescan finds
