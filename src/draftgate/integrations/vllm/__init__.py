"""DraftGate inside vLLM: DraftGate's drafters as vLLM's speculative proposer.

    vllm serve MODEL --speculative-config \\
        '{"method": "custom_class", "model": "draftgate.integrations.vllm.Proposer", "num_speculative_tokens": 8}'

vLLM verifies the drafts in its own scheduler, KV cache and rejection sampler, so greedy and
sampled output stay exactly vLLM's own. Settings and per-request options: `settings`; the
step's logic: `rounds`; remote drafts with deadline and prefetch: `remote`; metrics and the
runtime switch: `sidecar`; the plugin vLLM loads in each process: `plugin`.
"""

from draftgate.integrations.vllm.proposer import AutoProposer, NgramProposer, Proposer, RemoteProposer, SuffixProposer

__all__ = ["AutoProposer", "NgramProposer", "Proposer", "RemoteProposer", "SuffixProposer"]
