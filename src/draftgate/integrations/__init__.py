"""DraftGate inside engines it does not own.

``draftgate.integrations.vllm``: DraftGate's drafters as vLLM's speculative proposer (vLLM's
``custom_class`` method), registered by a vLLM plugin; vLLM verifies the drafts in its own
scheduler and rejection sampler.
"""
