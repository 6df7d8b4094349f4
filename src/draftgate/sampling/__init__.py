"""Logits to probabilities, and sampling with caller-supplied randomness (pure tensor math)."""

from draftgate.sampling.transforms import draw_uniforms, logits_to_probs, sample_from_probs

__all__ = ["draw_uniforms", "logits_to_probs", "sample_from_probs"]
