"""Suffix-trie drafter: continue the history the way it (or a past request) continued before.

After SuffixDecoding (Oliaro et al. 2024) and Arctic Inference's suffix
speculation. Two count tries over depth-limited substrings are kept:

* a **per-request** trie over the request's own prompt + output, which catches
  the request quoting itself or its prompt;
* a **global** trie over the outputs of finished requests (added on
  ``release``), bounded by ``global_capacity_tokens`` and evicting the oldest
  whole requests first, which catches agents and batch jobs that keep producing
  the same text across requests.

Proposing: take the longest suffix of the history (the *context*, at most
``max_depth - k`` tokens so the draft has room inside the depth limit, but never
capped below half the depth: a K near the depth then gets a shorter draft, not
one drawn from a one-token context) that occurred before with a following
token, then walk greedily to
the most frequent child. The empirical probability of a step is
``count(child) / out(node)``, where ``out`` counts the occurrences of the node
that have a next token (the current occurrence at the end of the history has
none, so it does not dilute the estimate). The walk stops when a step's
probability or the running product drops below ``min_prob``, at ``k`` tokens, or
at depth ``max_depth``. Each trie yields a candidate scored by its expected
accepted length (the sum of the running products); the higher score wins, the
per-request one on ties. Ties between children go to the lower token id, so
drafts do not depend on insertion order.

Representation (why it is fast and small in pure Python): every suffix of the
text is inserted as it grows, one token per *active* suffix per step, so a new
token costs O(number of suffixes still repeating), at most ``max_depth``. Nodes
are materialised only where a substring occurred at least twice; a substring
seen once is a ``_Tail``, a position in the token list standing for the whole
count-1 chain below it, which extends by itself as the list grows. Plain text
therefore costs about one tail per token, not ``max_depth`` nodes per token.
Histories are assumed append-only; one that got shorter, or whose last seen
token changed, is re-indexed from scratch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from draftgate.drafters.base import Abilities, Draft, DraftRequest

__all__ = ["SuffixDrafter", "SuffixMatch"]


class _Node:
    """A substring seen ``count`` times, ``out`` of which were followed by a token."""

    __slots__ = ("count", "out", "children")

    def __init__(self, count: int) -> None:
        self.count = count
        self.out = 0
        self.children: dict[int, _Node | _Tail] = {}


class _Tail:
    """A chain of count-1 nodes: the substring continues as ``text[pos:]`` (depth-limited)."""

    __slots__ = ("text", "pos")

    def __init__(self, text: list[int], pos: int) -> None:
        self.text = text
        self.pos = pos


# A position in a trie: (node, 0, depth), or (tail, tokens of the tail consumed, depth).
_Cursor = tuple["_Node | _Tail", int, int]


def _count(child: _Node | _Tail) -> int:
    return child.count if isinstance(child, _Node) else 1


class _SuffixTrie:
    """Counts of every substring of length <= max_depth in a set of token lists."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.root = _Node(0)

    def append(self, active: list[_Node], text: list[int], i: int) -> list[_Node]:
        """Extend every active suffix (plus the empty one) by ``text[i]``; return the new ones.

        ``active[j]`` is the node of the suffix of length j + 1 ending just before
        ``i``; only suffixes that occurred earlier are active, and they form an
        unbroken run of lengths because a repeated string's suffixes repeat too.
        """
        t, max_depth = text[i], self.max_depth
        new: list[_Node] = []
        depth = 0  # after the += below: the depth of the child being stepped into
        for node in (self.root, *active):
            depth += 1
            node.out += 1
            child = node.children.get(t)
            if child is None:  # first time this substring is seen: a lazy tail
                node.children[t] = _Tail(text, i)
                continue
            if isinstance(child, _Tail):  # seen once before: materialise, push the tail down
                split = _Node(2)
                node.children[t] = split
                child.pos += 1
                if depth < max_depth and child.pos < len(child.text):
                    split.children[child.text[child.pos]] = child
                    split.out = 1
                child = split
            else:
                child.count += 1
            if depth < max_depth:
                new.append(child)
        return new

    def add(self, text: list[int]) -> None:
        active: list[_Node] = []
        for i in range(len(text)):
            active = self.append(active, text, i)

    def remove(self, text: list[int]) -> None:
        """Undo ``add(text)``: subtract its substrings, dropping branches that reach zero."""
        n = len(text)
        for start in range(n):
            node = self.root
            for i in range(start, min(n, start + self.max_depth)):
                t = text[i]
                child = node.children[t]
                node.out -= 1
                if isinstance(child, _Tail) or child.count == 1:  # only this text lies below
                    del node.children[t]
                    break
                child.count -= 1
                node = child

    def locate(self, seq: list[int], start: int) -> _Cursor | None:
        """The position of ``seq[start:]`` in the trie, or None if it never occurred."""
        obj: _Node | _Tail = self.root
        off = 0
        depth = 0
        for i in range(start, len(seq)):
            t = seq[i]
            if isinstance(obj, _Node):
                child = obj.children.get(t)
                if child is None:
                    return None
                obj, off = child, 1
            else:
                idx = obj.pos + off
                if idx >= len(obj.text) or depth >= self.max_depth or obj.text[idx] != t:
                    return None
                off += 1
            depth += 1
        return obj, off, depth

    def has_next(self, cursor: _Cursor) -> bool:
        obj, off, depth = cursor
        if depth >= self.max_depth:
            return False
        if isinstance(obj, _Node):
            return obj.out > 0
        return obj.pos + off < len(obj.text)

    def longest_match(self, seq: list[int], max_len: int) -> _Cursor | None:
        """The longest suffix of ``seq`` (1..max_len tokens) that occurred with a next token.

        Binary search is valid because the property is monotone: if a suffix
        occurred with a follower, so did each of its own suffixes.
        """
        lo, hi = 0, min(max_len, len(seq))
        best: _Cursor | None = None
        while lo < hi:
            mid = (lo + hi + 1) // 2
            cursor = self.locate(seq, len(seq) - mid)
            if cursor is not None and self.has_next(cursor):
                lo, best = mid, cursor
            else:
                hi = mid - 1
        return best

    def walk(self, cursor: _Cursor, k: int, min_prob: float) -> tuple[list[int], float]:
        """Greedy most-frequent continuation from ``cursor``; returns (tokens, expected accepted)."""
        obj, off, depth = cursor
        tokens: list[int] = []
        cum, score = 1.0, 0.0
        while len(tokens) < k and depth < self.max_depth:
            if isinstance(obj, _Node):
                if obj.out == 0:
                    break
                tok, child = max(obj.children.items(), key=lambda kv: (_count(kv[1]), -kv[0]))
                prob = _count(child) / obj.out
                if prob < min_prob or cum * prob < min_prob:
                    break
                cum *= prob
                obj, off = child, 1
            else:
                idx = obj.pos + off
                if idx >= len(obj.text):
                    break
                tok = obj.text[idx]  # a single earlier occurrence: probability 1
                off += 1
            tokens.append(tok)
            score += cum
            depth += 1
        return tokens, score


@dataclass(frozen=True)
class SuffixMatch:
    """A suffix draft and its evidence: ``from_global`` (copied from earlier requests' outputs,
    not this request's own text), ``depth`` (tokens of context matched), ``score`` (expected
    accepted length by the trie's counts)."""

    token_ids: list[int]
    from_global: bool
    depth: int
    score: float


class _Request:
    """Per-sequence state: a private copy of the history and its trie."""

    __slots__ = ("text", "trie", "active", "prompt_len")

    def __init__(self, max_depth: int, prompt_len: int) -> None:
        self.text: list[int] = []
        self.trie = _SuffixTrie(max_depth)
        self.active: list[_Node] = []
        self.prompt_len = prompt_len


class SuffixDrafter:
    """Deterministic suffix-trie drafter (per request + global); q is one-hot."""

    name = "suffix"
    sampled_q = False

    def __init__(self, max_depth: int = 24, min_prob: float = 0.1, global_capacity_tokens: int = 200_000) -> None:
        if max_depth < 2:
            raise ValueError(f"max_depth must be >= 2, got {max_depth}")
        if not 0.0 <= min_prob <= 1.0:
            raise ValueError(f"min_prob must be in [0, 1], got {min_prob}")
        if global_capacity_tokens < 0:
            raise ValueError(f"global_capacity_tokens must be >= 0, got {global_capacity_tokens}")
        self.max_depth = max_depth
        self.min_prob = min_prob
        self.global_capacity_tokens = global_capacity_tokens
        self._global = _SuffixTrie(max_depth)
        self._global_texts: deque[list[int]] = deque()
        self._global_tokens = 0
        self._reqs: dict[int, _Request] = {}
        self.abilities = Abilities(lookup=True, forget=self.forget)

    @property
    def global_tokens(self) -> int:
        """Tokens currently held in the global trie (<= global_capacity_tokens)."""
        return self._global_tokens

    def forget(self) -> None:
        """Drop what finished requests left in the global trie (a benchmark's runs stay independent)."""
        self._global = _SuffixTrie(self.max_depth)
        self._global_texts.clear()
        self._global_tokens = 0

    # -- Drafter protocol -------------------------------------------------

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        """One draft per request: up to k tokens, [] when no context matches or k == 0."""
        out = []
        for r in requests:
            m = self.match(r.seq_id, r.tokens, r.k)
            out.append(Draft(token_ids=m.token_ids, context=m.depth if m.token_ids else 0))
        return out

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        """Index the tokens committed this round (the outcome itself is not used)."""
        self._sync(seq_id, tokens)

    def release(self, seq_id: int) -> None:
        """Move the request's output (tokens after the first history seen) into the global trie."""
        req = self._reqs.pop(seq_id, None)
        if req is not None:
            self._add_global(req.text[req.prompt_len :])

    # -- internals --------------------------------------------------------

    def match(self, seq_id: int, tokens: Sequence[int], k: int) -> SuffixMatch:
        """The draft for ``tokens`` (up to k tokens) with where it came from (see `SuffixMatch`)."""
        req = self._sync(seq_id, tokens)
        if k <= 0:
            return SuffixMatch([], False, 0, 0.0)
        max_ctx = max(self.max_depth - k, self.max_depth // 2)
        best = SuffixMatch([], False, 0, 0.0)
        m = min(len(req.active), max_ctx)
        if m > 0:
            toks, score = req.trie.walk((req.active[m - 1], 0, m), k, self.min_prob)
            best = SuffixMatch(toks, False, m, score)
        cursor = self._global.longest_match(req.text, max_ctx)
        if cursor is not None:
            toks, score = self._global.walk(cursor, k, self.min_prob)
            if score > best.score:
                best = SuffixMatch(toks, True, cursor[2], score)
        return best

    def _sync(self, seq_id: int, tokens: Sequence[int]) -> _Request:
        """Bring the request's trie up to ``tokens``, rebuilding if it was truncated."""
        req = self._reqs.get(seq_id)
        n = len(tokens)
        if req is None:
            req = self._reqs[seq_id] = _Request(self.max_depth, prompt_len=n)
        else:
            seen = len(req.text)
            if n < seen or (seen and int(tokens[seen - 1]) != req.text[-1]):
                req = self._reqs[seq_id] = _Request(self.max_depth, min(req.prompt_len, n))
        text, trie = req.text, req.trie
        for i in range(len(text), n):
            text.append(int(tokens[i]))
            req.active = trie.append(req.active, text, i)
        return req

    def _add_global(self, output: list[int]) -> None:
        cap = self.global_capacity_tokens
        if cap == 0 or not output:
            return
        text = list(output[-cap:])  # a request longer than the whole cache keeps its end
        self._global.add(text)
        self._global_texts.append(text)
        self._global_tokens += len(text)
        while self._global_tokens > cap:
            old = self._global_texts.popleft()
            self._global.remove(old)
            self._global_tokens -= len(old)
