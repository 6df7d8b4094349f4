"""DraftGate and vLLM, split by the process each part runs in.

Inside vLLM (`inside`): DraftGate's drafters as vLLM's speculative proposer::

    vllm serve MODEL --speculative-config \\
        '{"method": "custom_class", "model": "draftgate.integrations.vllm.Proposer", "num_speculative_tokens": 8}'

vLLM verifies the drafts in its own scheduler, KV cache and rejection sampler, so greedy and
sampled output stay exactly vLLM's own.

In the gateway (`gateway`): ``draftgate serve --target vllm+http://...``, a route to a vLLM that
runs the proposer, or the gateway's own rounds against a vLLM that only scores.

Both sides read the per-request option names and drafter names from `contract`; `tools` starts,
probes and compares vLLM servers for the tests, the demo and the benchmarks.
"""

from draftgate.integrations.vllm.inside.proposer import (
    AutoProposer,
    NgramProposer,
    Proposer,
    RemoteProposer,
    SuffixProposer,
)

__all__ = ["AutoProposer", "NgramProposer", "Proposer", "RemoteProposer", "SuffixProposer"]
