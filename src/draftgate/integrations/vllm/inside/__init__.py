"""What runs inside vLLM's processes: the proposer vLLM loads (`proposer`), one step's drafts
under the engine's policy (`rounds`), its settings and per-request options (`settings`), remote
drafts with deadline and prefetch (`remote`), metrics and the runtime switch (`sidecar`), and the
plugin vLLM loads in each process with its probed patches (`plugin`). Nothing here imports vLLM at
module level."""
