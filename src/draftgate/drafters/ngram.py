"""Prompt-lookup n-gram drafter: copy what followed the last time the recent tokens appeared.

This is prompt lookup decoding (HF ``prompt_lookup_num_tokens``, vLLM's ngram
proposer): for n from ``max_n`` down to ``min_n``, take the last n tokens of the
history, find an earlier occurrence, and propose the tokens that followed it.
It costs no model call, so it is worth trying every round; it shines on
outputs that quote or edit their input (code, summaries, RAG answers).

Choices a caller should know:

* **Most recent match.** Among earlier occurrences we take the latest one: text
  that was just written is the best predictor of what is written next (the
  variable name used two lines up, not the one from the prompt's first page).
  vLLM and HF take the earliest match instead; the latest costs the same with an
  index that is simply overwritten as the history grows.
* **Overlapping copy.** When the latest match is so recent that fewer than k
  tokens follow it (the match overlaps the current suffix: repeated tokens,
  ``a b a b a b``), we keep copying past the end of the history the way LZ77
  copies overlap: token i of the draft is ``history[pos + i]`` if that exists,
  else draft token ``pos + i - len(history)``. This extends the period the match
  implies, so a run of repeats yields a full k-token draft instead of one token.
* **Incremental index.** Per sequence we keep a dict from n-gram tuple to the
  position just after its latest occurrence, updated only with the new tokens
  each round (O(max_n - min_n + 1) per token), so a round costs a few dict
  look-ups however long the history is. Histories are assumed append-only; one
  that got shorter, or whose last indexed token changed, is re-indexed from
  scratch.
"""

from __future__ import annotations

from collections.abc import Sequence

from draftgate.drafters.base import Abilities, Draft, DraftRequest

__all__ = ["NgramDrafter"]


class _SeqIndex:
    """The n-gram index of one sequence's history.

    ``last_end[gram]`` is the index just after the latest occurrence of ``gram``
    whose following token is known, i.e. the start of its continuation. An
    n-gram ending at the very end of the history is not indexed until a token
    follows it, so a look-up of the history's own suffix only finds earlier
    occurrences.
    """

    __slots__ = ("tokens", "last_end")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.last_end: dict[tuple[int, ...], int] = {}


class NgramDrafter:
    """Deterministic prompt-lookup drafter; q is one-hot, so drafts carry ids only."""

    name = "ngram"
    sampled_q = False
    abilities = Abilities(lookup=True)  # its drafts are lookups: proposed in full, priced by their evidence

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        if min_n < 1 or max_n < min_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self._seqs: dict[int, _SeqIndex] = {}

    # -- Drafter protocol -------------------------------------------------

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        """One draft per request: up to k copied tokens, [] when nothing matches."""
        drafts: list[Draft] = []
        for req in requests:
            index = self._sync(req.seq_id, req.tokens)
            toks, n = self._lookup(index, req.k) if req.k > 0 else ([], 0)
            drafts.append(Draft(token_ids=toks, context=n))
        return drafts

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        """Index the tokens committed this round (the outcome itself is not used)."""
        self._sync(seq_id, tokens)

    def release(self, seq_id: int) -> None:
        self._seqs.pop(seq_id, None)

    @property
    def num_sequences(self) -> int:
        """How many sequences the drafter holds an index for (0 once every one is released)."""
        return len(self._seqs)

    # -- internals --------------------------------------------------------

    def _sync(self, seq_id: int, tokens: Sequence[int]) -> _SeqIndex:
        """Bring the sequence's index up to ``tokens``, rebuilding if it was truncated."""
        index = self._seqs.get(seq_id)
        seen = len(index.tokens) if index is not None else 0
        if index is None or len(tokens) < seen or (seen and int(tokens[seen - 1]) != index.tokens[-1]):
            index = self._seqs[seq_id] = _SeqIndex()
            seen = 0
        hist = index.tokens
        hist.extend(int(t) for t in tokens[seen:])
        last_end = index.last_end
        lo, hi = self.min_n, self.max_n
        # The n-grams ending at `end` become indexable once hist[end] exists; those
        # ending before `seen` were indexed in an earlier call.
        for end in range(max(seen, 1), len(hist)):
            for n in range(lo, min(hi, end) + 1):
                last_end[tuple(hist[end - n : end])] = end
        return index

    def _lookup(self, index: _SeqIndex, k: int) -> tuple[list[int], int]:
        """(up to k copied tokens, the length of the n-gram that matched); ([], 0) when none does."""
        hist = index.tokens
        size = len(hist)
        for n in range(min(self.max_n, size - 1), self.min_n - 1, -1):
            pos = index.last_end.get(tuple(hist[size - n :]))
            if pos is None:
                continue
            draft: list[int] = []
            for i in range(k):
                src = pos + i
                draft.append(hist[src] if src < size else draft[src - size])
            return draft, n
        return [], 0
