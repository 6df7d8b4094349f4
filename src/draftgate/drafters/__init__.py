"""Drafters: the ``Drafter`` protocol and its CPU implementations (n-gram, suffix trie)."""

from draftgate.drafters.base import Abilities, Draft, Drafter, DraftRequest, SparseQ
from draftgate.drafters.ngram import NgramDrafter
from draftgate.drafters.suffix import SuffixDrafter

__all__ = ["Abilities", "Draft", "DraftRequest", "Drafter", "NgramDrafter", "SparseQ", "SuffixDrafter"]
