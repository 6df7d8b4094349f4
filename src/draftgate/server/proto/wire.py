"""Conversions between internal types and the target worker's protobuf messages (the edge only)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from draftgate.drafters.base import Draft, SparseQ, is_one_hot
from draftgate.server.proto import target_pb2 as pb
from draftgate.types import SamplingParams

__all__ = ["GRPC_PREFIX", "WireStats", "params_from_pb", "params_to_pb", "q_rows_from_pb", "round_to_pb"]

GRPC_PREFIX = 5  # each gRPC message on the wire: 1 flag byte + 4 length bytes


@dataclass
class WireStats:
    """Bytes of the verification rounds on the wire (protobuf payload + 5-byte gRPC frame prefix)."""

    rounds: int = 0
    request_bytes: int = 0
    response_bytes: int = 0
    max_round_bytes: int = 0

    @property
    def bytes_per_round(self) -> float:
        return (self.request_bytes + self.response_bytes) / self.rounds if self.rounds else 0.0


def params_to_pb(p: SamplingParams) -> pb.SamplingParams:
    msg = pb.SamplingParams(
        temperature=float(p.temperature),
        top_k=p.top_k,
        top_p=float(p.top_p),
        max_new_tokens=p.max_new_tokens,
        ignore_eos=p.ignore_eos,
        stop=list(p.stop),
    )
    if p.seed is not None:
        msg.seed = p.seed
    return msg


def params_from_pb(m: pb.SamplingParams) -> SamplingParams:
    """The request's params; top_p 0 (an unset field) means off, like 1.0."""
    return SamplingParams(
        temperature=m.temperature,
        top_k=m.top_k,
        top_p=m.top_p if m.top_p > 0 else 1.0,
        seed=m.seed if m.HasField("seed") else None,
        max_new_tokens=m.max_new_tokens,
        stop=tuple(m.stop),
        ignore_eos=m.ignore_eos,
    )


def round_to_pb(d: Draft) -> pb.SessionRequest:
    """A Round: the draft ids, plus q's support per row unless q is one-hot (then ids only).

    A dense q goes over the wire as its nonzero entries, which is exact but as large
    as its support: sampled model drafts should use top-k/top-p (or the HTTP draft
    worker, which already truncates q) to keep rounds small.
    """
    r = pb.Round(draft=d.token_ids)
    if not is_one_hot(d):
        assert d.q is not None
        if isinstance(d.q, SparseQ):
            ids, probs = d.q.ids, d.q.probs
        else:
            probs, ids = d.q, torch.arange(d.q.shape[1]).expand_as(d.q)
        for i in range(len(d.token_ids)):
            keep = probs[i] > 0  # [M]
            r.q.add(ids=ids[i][keep].tolist(), probs=probs[i][keep].float().tolist())
    return pb.SessionRequest(round=r)


def q_rows_from_pb(r: pb.Round) -> Sequence[tuple[Sequence[int], Sequence[float]]]:
    return [(row.ids, row.probs) for row in r.q]
